"""Early exit on ONNX Runtime: the pieces `finetune export --layout onnx` writes (`finetune.serve.onnx_export`), run by
the one early-exit engine (`elasticbert.early_exit.run_batch`) through its `LayerRunner` interface.

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

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.errors import ConfigError
from common.integrity import CHECKSUMS, IntegrityError
from common.io import read_object
from elasticbert.configuration import ElasticBertConfig
from elasticbert.exit_setting import PRECISIONS
from elasticbert.layer_runner import EmbeddingInputs, LayerRunner, StepCost, StepOutput
from elasticbert.loading import read_config
from elasticbert.verification import CheckpointError, checksum_verification, verify_model_directory

from .onnx_export import FORMAT, MANIFEST, OLD_FORMATS
from .onnx_graphs import EXIT_ROWS
from .onnx_one_file import ONE_FILE_MAX_BATCH, OneFileEngine, one_file_session, rule_feeds

RUNTIMES = ("torch", "onnxruntime")
UNVERIFIED = "--no-verify-checksums (predict) or verify_checksums=False (EarlyExitClassifier.from_pretrained)"


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
            f"it, or load it anyway with {UNVERIFIED}"
        )
    verify_model_directory(directory)  # checksums.json (the export is sealed); --no-verify-checksums skips it
    manifest = read_object(directory / MANIFEST, ConfigError, "an ONNX export manifest")
    found = manifest.get("format")
    if found in OLD_FORMATS:
        source = manifest.get("source") or "RUN/best"
        raise ConfigError(
            f"{directory / MANIFEST}: format {found!r} ({OLD_FORMATS[found]}) is no longer served; this code runs "
            f"{FORMAT!r} (one session per layer, its exit head fused in). Re-export it: `python -m finetune export "
            f"--layout onnx --model {source} --output {directory} --overwrite`"
        )
    if found != FORMAT:
        raise ConfigError(f"{directory / MANIFEST}: format {found!r}, this code reads {FORMAT!r}")
    return manifest


def _steps(directory: Path, manifest: dict, precision: str) -> tuple[list[str], list[int | None]]:
    pieces = manifest.get("pieces") or {}
    steps = (pieces.get("steps") or {}).get(precision)
    exits = pieces.get("step_exits")
    if precision not in manifest.get("precisions", []) or not steps:
        raise ConfigError(f"{directory / MANIFEST}: no {precision} steps (it has {manifest.get('precisions')})")
    if not isinstance(exits, list) or len(exits) != len(steps):
        raise ConfigError(f"{directory / MANIFEST}: pieces.step_exits must list one exit (or null) per step")
    for name in [*steps, *(pieces.get("shared") or [])]:
        if not name or not (directory / name).is_file():
            raise IntegrityError(f"{directory / str(name)}: missing (listed in {directory / MANIFEST})")
    return steps, exits


PARALLEL_MIN_TOKENS = 256  # rows x padded length from which a layer runs on `threads` threads (see OnnxLayers)
# One thread, MiniLM-size steps (bench/serving_steps.py, docs/results/serving_steps/): a session run costs ~0.2 ms
# besides ~12 us per token in int8 (17 tokens' worth); the SST-2 stream at batch 32 is fastest at 8-28 (1.77x one
# step per call in int8, 1.66-1.78x in fp32); past ~512 tokens a step slows per token (1.18-1.47x the fit at 1,024+).
ONNX_STEP_COST = StepCost(call_tokens=16, max_tokens=512)


# ONNX Runtime fuses a layer's (dense + bias) + residual -> LayerNorm into one SkipLayerNormalization once it can see
# the shapes (the export's constant reshape targets let it): on this CPU (onnxruntime 1.32, one thread) that kernel
# took ~60 us per call at 1 x 25 tokens where the three it replaces took ~15, and the SST-2 step 389 -> 487 us
# (interleaved A/B, the same export with and without it): it stays off. Old exports never had it fused.
DISABLED_FUSIONS = ["SkipLayerNormFusion"]


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
    """The ONNX steps of an export as the engine's layer runner (CPU): one session run per layer call, the
    embeddings folded into the first and the exit head into every layer that has one (`onnx_export`).

    Threads: a step's run is short (a layer of one request: ~0.5 ms), so waking a second thread costs more than it
    saves there; each step is therefore opened twice when `threads` > 1, and a batch of fewer than
    `PARALLEL_MIN_TOKENS` tokens (rows x padded length: a request, a flush's last rows) runs on the one-thread
    session, a larger one on the `threads`-thread session (SST-2 dev, entropy early exit, int8, 2 threads: batch 1
    single-threaded 2.4x faster than on 2 threads; batch 32 on 2 threads 11 % faster than on one). Memory: the
    layers' weights twice.
    """

    def __init__(self, directory: str | Path, precision: str = "fp32", threads: int | None = None) -> None:
        try:
            import onnxruntime  # noqa: F401
        except ImportError as err:
            raise ConfigError("--runtime onnxruntime needs onnxruntime: pip install '.[serve]'") from err
        if precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
        self.directory = Path(directory)
        self.verified = checksum_verification()  # (the one file opens later, outside a caller's verification block)
        manifest = read_manifest(self.directory)
        steps, step_exits = _steps(self.directory, manifest, precision)
        self.manifest, self.max_length = manifest, int(manifest.get("max_length") or 128)
        self.config = ElasticBertConfig.from_dict(read_config(self.directory))
        self.exit_layers = tuple(int(layer) for layer in manifest["exit_layers"])
        if tuple(layer for layer in step_exits if layer is not None) != self.exit_layers:
            raise ConfigError(f"{self.directory / MANIFEST}: the steps' exits {step_exits} are not {self.exit_layers}")
        self.name_or_path = str(self.directory)
        self.device, self.inference_precision = torch.device("cpu"), precision
        self.step_cost = ONNX_STEP_COST
        self.threads = threads or torch.get_num_threads()

        session = self._session
        self.steps = [session(name) for name in steps]
        self.parallel_steps = [session(name, self.threads) for name in steps] if self.threads > 1 else self.steps
        self._one_file: tuple | None = None  # (session, the manifest's single_file), opened when first asked for
        self.has_exit = [layer is not None for layer in step_exits]
        self.outputs = [[o.name for o in s.get_outputs()] for s in self.steps]
        self._rows = {n: np.array([n], dtype=np.int64) for n in (0, 1)}

    def _session(self, name: str, threads: int = 1) -> Any:
        import onnxruntime as ort

        options = _session_options(threads)
        options.log_severity_level = 3  # the one file's optional thresholds are noted as a warning: expected
        try:
            return ort.InferenceSession(
                str(self.directory / name),
                options,
                providers=["CPUExecutionProvider"],
                disabled_optimizers=DISABLED_FUSIONS,
            )
        except _runtime_errors() as err:  # a truncated piece under --no-verify-checksums: one line naming it
            raise unloadable(self.directory, name, self.manifest, err, self.verified) from None

    def eval(self) -> OnnxLayers:
        return self

    def one_file_engine(self, rule: Any, batch_size: int) -> OneFileEngine | None:
        """The export's one file as the stream's engine for `rule` at `batch_size` (`onnx_one_file`), or None where
        the per-layer queues serve: a batch size above `ONE_FILE_MAX_BATCH`, an export without the file, a rule the
        file does not hold."""
        if batch_size > ONE_FILE_MAX_BATCH:
            return None
        if self._one_file is None:
            opened = one_file_session(self.directory, self.manifest, self.inference_precision, self._session)
            self._one_file = opened or (None, None)
        session, single = self._one_file
        feeds = rule_feeds(single, rule) if session is not None else None
        exits = self.exit_layers if rule.can_fire else self.exit_layers[-1:]
        if feeds is None or tuple(single.get("exit_layers") or ()) != exits:
            return None
        return OneFileEngine(session, feeds, exits, batch_size)

    def step(
        self, index: int, inputs: torch.Tensor | EmbeddingInputs, mask: torch.Tensor, padded: bool, with_exit: bool
    ) -> StepOutput:
        rows, length = mask.shape
        feeds = {"mask": _array(mask)}
        if index == 0:
            ids, types, positions = inputs
            if positions is not None:
                raise ValueError("the ONNX embeddings compute their own positions: pass no position_ids")
            feeds["input_ids"], feeds["token_type_ids"] = _array(ids), _array(types)
        else:
            feeds["hidden"] = _array(inputs)
        if self.has_exit[index]:
            count = rows if with_exit else 0
            feeds[EXIT_ROWS] = self._rows.get(count) if count < 2 else np.array([count], dtype=np.int64)
        sessions = self.parallel_steps if rows * length >= PARALLEL_MIN_TOKENS else self.steps
        values = dict(zip(self.outputs[index], sessions[index].run(None, feeds)))
        hidden = values.get("hidden_out")
        out = StepOutput(torch.from_numpy(hidden) if hidden is not None else None)
        if with_exit:
            out.representation = torch.from_numpy(values["representation"])
            out.logits = torch.from_numpy(values["logits"])
        return out


def _runtime_errors() -> tuple[type[Exception], ...]:
    """The exceptions ONNX Runtime raises (its own classes, each a bare Exception)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    found = vars(state).values()
    return tuple(v for v in found if isinstance(v, type) and issubclass(v, Exception) and "onnxruntime" in v.__module__)


def unloadable(directory: Path, name: str, manifest: dict, err: Exception, verified: bool) -> CheckpointError:
    """The refusal of a file of the export ONNX Runtime cannot load: the file (or, when its external data is at fault,
    that file: the step-0 pieces read the shared word embeddings), ONNX Runtime's reason, and what to do; `verified`:
    whether the export's checksums were checked when it was opened."""
    text = str(err)
    reason = re.sub(r"^\[ONNXRuntimeError\] : \d+ : |Load model from \S+ failed:|\S+\.cc:\d+ \S+ ", "", text)
    reason = " ".join(reason.replace(" : ", ": ").split()).rstrip(".")[:300]
    shared = (manifest.get("pieces") or {}).get("shared") or []
    culprit = f"{directory / name}"
    if "external" in text.lower() and shared:
        culprit = f"{', '.join(str(directory / f) for f in shared)} (external data of {directory / name})"
    if verified:
        why = "the file passed its checksums, so this onnxruntime cannot read what the export wrote"
    else:
        why = "the file is truncated or damaged (loaded unverified: its checksums, which would name it, were skipped)"
    source = manifest.get("source") or "RUN/best"
    return CheckpointError(
        f"{culprit}: ONNX Runtime cannot load it ({reason}): {why}; re-export it: "
        f"python -m finetune export --layout onnx --model {source} --output {directory} --overwrite"
    )


def _array(tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor as the contiguous numpy array a session takes (no copy when it is contiguous already)."""
    return tensor.numpy() if tensor.is_contiguous() else np.ascontiguousarray(tensor.numpy())
