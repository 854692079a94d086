"""Our own serving of the one-file early-exit model (`onnx_single`): the prediction stream's engine at batch 1.

`predict --runtime onnxruntime` and `EarlyExitClassifier.from_pretrained(EXPORT, runtime="onnxruntime")` serve an
export through the per-layer queues (`elasticbert.exit_queues` over `onnx_runtime.OnnxLayers`), which win wherever
rows of several inputs can share a layer call. A request served alone (`batch_size` 1) gains nothing from the queues
and pays a session run and the engine's Python per layer; there the stream runs the export's one file instead: one
session run per input, the rule inside the graph (`OneFileEngine`, the same interface as `ExitQueues` for the
stream). Its answers are the queues' (tests/finetune_early_exit/test_onnx_single_file.py); the rule's threshold is
fed to the file's `threshold` input, so an operating point chosen at run time is served as well as the saved one.
The file serves a rule of its own strategy only (its PCEE patience the same); otherwise the stream keeps the queues.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.errors import ConfigError
from elasticbert.exit_queues import Finished

# The stream's batch sizes the one file serves. Above it the queues serve: they batch rows of several inputs at every
# layer of a stream. (SST-2, CPU time under load, docs/onnx_single_file.md: at batch 1 the file through the stream
# 340/s against the queues' 309/s; at batch 32 the file as a plain session 1.09x the queues, through the stream not
# measured yet.)
ONE_FILE_MAX_BATCH = 1


def rule_feeds(single: dict, rule: Any) -> dict[str, np.ndarray] | None:
    """The feeds that make the file described by `single` (the manifest's `single_file`) run `rule`, or None when it
    cannot (another strategy, another PCEE patience, a learned head we cannot compare)."""
    saved = single.get("rule") or {}
    strategy = saved.get("strategy")
    if strategy != rule.name or strategy == "lte":
        return None
    if strategy == "static":
        return {}
    if strategy == "pcee" and int(saved.get("patience", 2)) != rule.patience:
        return None
    feeds = {"threshold": np.array(rule.threshold, dtype=np.float32)}
    if "delta" in (single.get("rule_inputs") or {}):
        feeds["delta"] = np.array(rule.delta, dtype=np.float32)
    return feeds


class OneFileEngine:
    """The one-file model as the prediction stream's engine (`ExitQueues`' interface: submit, pump, flush, take):
    each submitted row runs at once as one session run of its own tokens (the graph decides where it exits)."""

    def __init__(self, session: Any, feeds: dict[str, np.ndarray], exits: tuple[int, ...], batch_size: int) -> None:
        self.session, self.feeds, self.exits, self.batch_size = session, feeds, exits, batch_size
        self.position = {layer: i + 1 for i, layer in enumerate(exits)}  # exit layer -> exit heads run
        self.done: list[tuple] = []
        self.next_slot = 0
        self.calls = [0]
        self.steps = [0]

    def submit(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> range:
        rows = input_ids.shape[0]
        lengths = attention_mask.sum(1)
        arrays = [t.numpy() for t in (input_ids, attention_mask, token_type_ids)]
        start = self.next_slot
        for first in range(0, rows, self.batch_size):
            chunk = slice(first, first + self.batch_size)
            longest = int(lengths[chunk].max())
            feeds = {
                name: a[chunk, :longest] for name, a in zip(("input_ids", "attention_mask", "token_type_ids"), arrays)
            }
            logits, exit_layers = self.session.run(["logits", "exit_layer"], {**feeds, **self.feeds})
            slots = torch.arange(start + first, start + min(first + self.batch_size, rows))
            self.done.append((slots, logits, exit_layers, lengths[chunk]))
            self.calls[0] += 1
            self.steps[0] += 1
        self.next_slot += rows
        return range(start, self.next_slot)

    def pump(self) -> None:
        """Nothing waits: `submit` ran everything."""

    def flush(self) -> None:
        """Nothing waits: `submit` ran everything."""

    def fill(self) -> float:
        return 1.0

    def take(self) -> Finished:
        done, self.done = self.done, []
        if not done:
            empty = torch.empty(0, dtype=torch.long)
            return Finished(empty, torch.empty(0, 0), empty, empty, empty)
        slots, logits, layers, lengths = zip(*done)
        exit_layers = torch.from_numpy(np.concatenate(layers))
        heads = torch.tensor([self.position[int(layer)] for layer in exit_layers.tolist()], dtype=torch.long)
        return Finished(
            torch.cat(slots), torch.from_numpy(np.concatenate(logits)), exit_layers, heads, torch.cat(lengths)
        )


def one_file_session(directory: Path, manifest: dict, precision: str, session: Any) -> tuple[Any, dict] | None:
    """(the session of the export's one file at `precision`, the manifest's `single_file`), or None when the export
    has none (written before the one file existed); `session(name)` opens a file of the export."""
    single = manifest.get("single_file")
    if not single:
        return None
    name = (single.get("files") or {}).get(precision)
    if not name or not (directory / name).is_file():
        raise ConfigError(f"{directory / str(name)}: missing (listed in the manifest's single_file)")
    return session(name), single
