"""Early exit on ONNX Runtime: the pieces `finetune export --layout onnx` writes (`finetune.onnx_export`), run by the
one early-exit engine (`elasticbert.early_exit.run_batch`) through its `LayerRunner` interface.

`OnnxLayers(directory, precision)` opens one ONNX Runtime session per piece (embeddings, each layer at `precision`,
each exit head) and hands the engine torch tensors that share the sessions' numpy buffers (no copy): the rules, the
samples leaving the batch and the length cutting are the engine's, unchanged. In fp32 the results equal the eager
engine's (same exits and predictions; logits within 1e-5, tests/finetune_early_exit/test_onnx_runtime.py); in int8
an input's exits and logits are the same served alone or in a batch (per-token activation scales, `onnx_export`).

Before any session opens, the directory is verified: every file against its checksums.json (a flipped byte, a
truncated or missing piece is refused by name), the manifest's format, and every piece the manifest lists. The
exporter always seals, so an export without checksums.json (its seal marker removed too) is refused as well: it
cannot be legitimate, and a bit-rotted piece in it could not be told from a sound one.

    classifier = EarlyExitClassifier.from_pretrained("exports/sst2_onnx", runtime="onnxruntime")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.errors import ConfigError
from common.integrity import CHECKSUMS, IntegrityError
from common.io import read_object
from elasticbert.configuration import ElasticBertConfig
from elasticbert.early_exit import LayerRunner
from elasticbert.exit_setting import PRECISIONS
from elasticbert.loading import read_config
from elasticbert.verification import checksum_verification, verify_model_directory

from .onnx_export import FORMAT, MANIFEST

RUNTIMES = ("torch", "onnxruntime")


def is_onnx_export(directory: str | Path) -> bool:
    return (Path(directory) / MANIFEST).is_file()


def read_manifest(directory: Path) -> dict:
    """The export's manifest, after the directory's checksums are verified; refusals name the file at fault."""
    if not (directory / MANIFEST).is_file():
        raise ConfigError(
            f"{directory}: not an ONNX early-exit export (no {MANIFEST}); write one with "
            "`python -m finetune export --layout onnx --model RUN/best --output DIR`"
        )
    if checksum_verification() and not (directory / CHECKSUMS).is_file():  # the exporter always seals: no seal,
        raise IntegrityError(  # no way to tell a bit-rotted piece from a sound one
            f"{directory / CHECKSUMS} is missing: `finetune export --layout onnx` seals every export it writes, so "
            "this one was copied in part or had its checksums removed, and its pieces cannot be verified; re-export "
            "it, or load it anyway with --no-verify-checksums"
        )
    verify_model_directory(directory)  # checksums.json (the export is sealed); --no-verify-checksums skips it
    manifest = read_object(directory / MANIFEST, ConfigError, "an ONNX export manifest")
    if manifest.get("format") != FORMAT:
        raise ConfigError(f"{directory / MANIFEST}: format {manifest.get('format')!r}, this code reads {FORMAT!r}")
    return manifest


def _pieces(directory: Path, manifest: dict, precision: str) -> tuple[str, list[str], dict[str, str]]:
    pieces = manifest.get("pieces") or {}
    layers = (pieces.get("layers") or {}).get(precision)
    if precision not in manifest.get("precisions", []) or not layers:
        raise ConfigError(f"{directory / MANIFEST}: no {precision} layers (it has {manifest.get('precisions')})")
    exits = pieces.get("exits") or {}
    for name in [pieces.get("embeddings"), *layers, *exits.values()]:
        if not name or not (directory / name).is_file():
            raise IntegrityError(f"{directory / str(name)}: missing (listed in {directory / MANIFEST})")
    return pieces["embeddings"], layers, exits


PARALLEL_MIN_TOKENS = 256  # rows x padded length from which a layer runs on `threads` threads (see OnnxLayers)


def _session_options(threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Every session has its own intra-op pool; spinning workers of a dozen sessions starve each other and the engine
    # between runs (SST-2 at 2 threads: 44 inputs/s spinning against 227 not, batch 1; 120 against 1,080, batch 32).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


class OnnxLayers(LayerRunner):
    """The ONNX pieces of an export as the engine's layer runner (CPU).

    Threads: a piece's run is short (a layer of one request: ~0.5 ms), so waking a second thread costs more than it
    saves there; each layer is therefore opened twice when `threads` > 1, and a batch of fewer than
    `PARALLEL_MIN_TOKENS` tokens (rows x padded length: a request, the last survivors of a batch) runs on the
    one-thread session, a larger one on the `threads`-thread session (SST-2 dev, entropy early exit, int8, 2 threads:
    batch 1 single-threaded 2.4x faster than on 2 threads; batch 32 on 2 threads 11 % faster than on one). The
    embeddings (a gather) and the exit heads (~1 % of the work) run on one thread. Memory: the layers' weights twice.
    """

    def __init__(self, directory: str | Path, precision: str = "fp32", threads: int | None = None) -> None:
        try:
            import onnxruntime as ort
        except ImportError as err:
            raise ConfigError("--runtime onnxruntime needs onnxruntime: pip install '.[serve]'") from err
        if precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
        self.directory = Path(directory)
        manifest = read_manifest(self.directory)
        embeddings, layers, exits = _pieces(self.directory, manifest, precision)
        self.manifest, self.max_length = manifest, int(manifest.get("max_length") or 128)
        self.config = ElasticBertConfig.from_dict(read_config(self.directory))
        self.exit_layers = tuple(int(layer) for layer in manifest["exit_layers"])
        self.name_or_path = str(self.directory)
        self.device, self.inference_precision = torch.device("cpu"), precision
        self.threads = threads or torch.get_num_threads()

        def session(name: str, threads: int = 1) -> Any:
            options = _session_options(threads)
            return ort.InferenceSession(str(self.directory / name), options, providers=["CPUExecutionProvider"])

        self.embeddings = session(embeddings)
        self.layers = [session(name) for name in layers]
        self.parallel_layers = [session(name, self.threads) for name in layers] if self.threads > 1 else self.layers
        self.exits = {int(layer): session(name) for layer, name in exits.items()}
        self.exit_inputs = {layer: {i.name for i in s.get_inputs()} for layer, s in self.exits.items()}
        self._ones: dict[tuple[int, int], np.ndarray] = {}

    def eval(self) -> OnnxLayers:
        return self

    def _ones_mask(self, shape: tuple[int, int]) -> np.ndarray:
        mask = self._ones.get(shape)
        if mask is None:
            mask = self._ones[shape] = np.ones(shape, dtype=np.int64)
        return mask

    def embed(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, position_ids: torch.Tensor | None
    ) -> torch.Tensor:
        if position_ids is not None:
            raise ValueError("the ONNX embeddings compute their own positions: pass no position_ids")
        ids = input_ids.numpy()
        types = np.zeros_like(ids) if token_type_ids is None else token_type_ids.numpy()
        return torch.from_numpy(self.embeddings.run(None, {"input_ids": ids, "token_type_ids": types})[0])

    def layer_mask(self, attention_mask: torch.Tensor) -> np.ndarray | None:
        return None if bool(attention_mask.all()) else np.ascontiguousarray(attention_mask.numpy(), dtype=np.int64)

    def run_layer(self, index: int, hidden: torch.Tensor, layer_mask: Any) -> torch.Tensor:
        h = np.ascontiguousarray(hidden.numpy())
        mask = self._ones_mask(h.shape[:2]) if layer_mask is None else layer_mask
        sessions = self.parallel_layers if h.shape[0] * h.shape[1] >= PARALLEL_MIN_TOKENS else self.layers
        return torch.from_numpy(sessions[index].run(None, {"hidden": h, "mask": mask})[0])

    def classify(
        self, layer: int, hidden: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = np.ascontiguousarray(hidden.numpy())
        feeds = {"hidden": h}
        if "mask" in self.exit_inputs[layer]:  # a linear exit reads [CLS] only: its graph has no mask input
            mask = self._ones_mask(h.shape[:2]) if attention_mask is None else attention_mask.numpy()
            feeds["mask"] = np.ascontiguousarray(mask, dtype=np.int64)
        representation, logits = self.exits[layer].run(None, feeds)
        return torch.from_numpy(representation), torch.from_numpy(logits)
