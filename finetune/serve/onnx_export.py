"""`finetune export --layout onnx`: a fine-tuned multi-exit model as ONNX pieces that early exit can stop between.

Data-dependent exits do not trace into one graph, so the model is written as the engine's units of work, one *step*
per layer (`elasticbert.layer_runner`): layer i, with the embeddings folded in ahead of the first layer and the exit
head on top of every layer that has one, each its own ONNX graph (opset 17) with dynamic batch and length axes — one
ONNX Runtime session run per layer call (format 1 ran three kinds of piece: embeddings, layer, exit head). The exit
runs on the first `exit_rows` rows of the call: all of them when the engine asks for the exit, none when it does not
(the full model, a restricted exit set: an empty head costs its op overheads only), so a run's FLOPs are what the
torch engine counts. Each step is written twice: fp32, and int8 (`per_token_int8`, on the layer's matmuls only:
per-channel symmetric int8 weights; activations quantized per call with one scale per token, so an input's result
does not depend on the inputs batched with it — `onnxruntime.quantization.quantize_dynamic`'s one scale per tensor
made the serving bench's thresholds move with the batching; per token costs 8-10 % per layer,
bench/int8_batch_invariance.py). Embeddings and exit heads stay fp32 at both precisions, as in torch's int8 (the
heads are ~1 % of the FLOPs and where the exit decisions are made). The traced pieces are joined into steps by
`onnx_graphs`; the word-embedding table, the bulk of a small model, is stored once (`onnx/word_embeddings.bin`,
external data both first steps read).

    OUTPUT/
      config.json          the model's config (exit layers, labels, the saved early-exit setting), sealed
      vocab.txt, tokenizer.json, ...                   the tokenizer files
      onnx/manifest.json   format 2, steps per precision and the exit each carries, max_length, opset, the source
      onnx/step_{i}.onnx, onnx/step_{i}.int8.onnx, onnx/word_embeddings.bin
      checksums.json       every file's sha256 (`common.integrity.seal`)

`finetune.serve.onnx_runtime.OnnxLayers` serves it (`EarlyExitClassifier.from_pretrained(OUTPUT,
runtime="onnxruntime")`, `predict --runtime onnxruntime`) and refuses a format-1 export, naming the command that
re-exports it. Exporting needs `torch`, `onnx` and `onnxruntime` (the `export` extra); serving needs `onnxruntime` (the
`serve` extra).
"""

from __future__ import annotations

import copy
import io
import math
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common.errors import ConfigError
from common.integrity import seal
from common.io import atomic_path, atomic_write_json, make_dirs, removed_on_failure
from common.outputs import ONNX_EXPORT, Output, check_output
from common.run_dir import describe_write_error
from elasticbert.exit_setting import EarlyExitSetting
from elasticbert.fnlp_export import copy_tokenizer_files
from elasticbert.loading import read_config

from ..model import load_finetuned
from .onnx_graphs import (
    ORT_DOMAIN,
    exit_on_rows,
    externalize,
    join,
    rename_output,
    static_reshapes,
)
from .onnx_single import SINGLE_FILES, SINGLE_FORMAT, Traced, rule_plan, single_file, single_metadata

ONNX_DIR = "onnx"
MANIFEST = f"{ONNX_DIR}/manifest.json"
FORMAT = "elasticbert-onnx-early-exit/2"
OLD_FORMATS = {"elasticbert-onnx-early-exit/1": "one piece per layer and per exit head, the embeddings apart"}
ONNX_OUTPUT = Output(
    "export --layout onnx",
    "an ONNX early-exit export",
    folder=True,
    whole=True,
    own=lambda path: (path / MANIFEST).is_file(),
    accepts=(ONNX_EXPORT,),
)
OPSET = 17
INT8_SCHEME = "per-token symmetric activations (uint8, zero point 128), per-channel symmetric int8 weights"
WORD_EMBEDDINGS = "word_embeddings.bin"  # the step-0 pieces' shared vocabulary table (external data, beside them)
WORD_EMBEDDINGS_WEIGHT = "embeddings.word_embeddings.weight"


def step_file(index: int, precision: str) -> str:
    return f"{ONNX_DIR}/step_{index}.onnx" if precision == "fp32" else f"{ONNX_DIR}/step_{index}.{precision}.onnx"


class _Embeddings(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.embeddings = model.elasticbert.embeddings

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        return self.embeddings(input_ids, token_type_ids, None)


class _Layer(nn.Module):
    def __init__(self, model: nn.Module, index: int) -> None:
        super().__init__()
        self.model, self.index = model, index

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model.elasticbert.encoder.run_layer(self.index, hidden, mask[:, None, None, :].bool())


class _Exit(nn.Module):
    def __init__(self, model: nn.Module, layer: int) -> None:
        super().__init__()
        self.model, self.layer = model, layer

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.classify(self.layer, hidden, mask)


@contextmanager
def _static_attention() -> Iterator[None]:
    """`F.scaled_dot_product_attention` as the tracer should see it: the scale a constant and a boolean mask the
    additive -inf mask it stands for. Why: left to itself the exporter computes 1 / sqrt(head size) from the query's
    runtime shape (seven shape ops per attention on every call) and guards the softmax of a boolean mask against
    all-masked rows (IsNaN + Where per attention; a row here always has a token). At batch 1 a step is mostly such
    small kernels: the layer's attention and the MHA exit's lose 18 of a step's 137. Same arithmetic (the guard never
    fires; the scale is the default's)."""
    original = F.scaled_dot_product_attention

    def traced(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        **options: Any,
    ) -> torch.Tensor:
        if scale is None:
            scale = 1.0 / math.sqrt(query.shape[-1])
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = torch.where(attn_mask, torch.tensor(0.0), torch.tensor(-math.inf))
        return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **options)

    F.scaled_dot_product_attention = traced
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def _export(module: nn.Module, example: tuple, inputs: list[str], outputs: list[str]) -> Any:
    """`module` traced to ONNX (opset 17, dynamic batch and length axes), as an `onnx.ModelProto`."""
    import onnx

    axes = {name: {0: "batch", 1: "length"} for name in inputs}
    axes.update({name: {0: "batch", 1: "length"} for name in outputs if name == "hidden_out"})
    axes.update({name: {0: "batch"} for name in outputs if name in ("representation", "logits")})
    buffer = io.BytesIO()
    with warnings.catch_warnings(), _static_attention():  # warnings: the TorchScript exporter's deprecation notes
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(),
            example,
            buffer,
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
    return onnx.load_from_string(buffer.getvalue())


_INT8_CONSTANTS = {
    "pt_127": np.float32(127),
    "pt_eps": np.float32(1e-12),
    "pt_one": np.float32(1),
    "pt_zp": np.uint8(128),
}


def per_token_int8(model: Any) -> Any:
    """`model` (an fp32 `onnx.ModelProto`) with every MatMul by a constant weight computed in int8: the weight
    per-channel symmetric (its fp32 copy dropped), the activations quantized per call with one symmetric scale per
    token (row of the last axis: max |x| / 127, as uint8 with zero point 128), the int32 product scaled back by the
    weight's then the token's scale. One quantization per distinct input, and one product per input too: the MatMuls
    of one input (query, key and value) run as one of their weights side by side, then split (the same sums, column
    by column, bit for bit; 6 kernels fewer per layer: with the constant reshape targets, `onnx_graphs.static_reshapes`,
    2-3 % more SST-2 inputs/s at batch 1 and 32).

    The product and the weight's scale are one ONNX Runtime kernel, `com.microsoft.MatMulIntegerToFloat` (its
    A scale 1: it reads A's scale per tensor, never per row, so the token's scale is a Mul after it): the same
    arithmetic as MatMulInteger → Cast → Mul, two kernels fewer per matmul. ONNX Runtime has no per-row
    quantization kernel: the activations' side is standard ops."""
    import onnx
    from onnx import helper, numpy_helper

    weights = {init.name: init for init in model.graph.initializer}
    products: dict[str, list] = {}  # input -> its MatMuls by a constant weight, in graph order
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in weights:
            products.setdefault(node.input[0], []).append(node)
    extra = [numpy_helper.from_array(np.array(value), name) for name, value in _INT8_CONSTANTS.items()]
    nodes, replaced = [], set()
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in weights:
            nodes.append(node)
            continue
        group = products.pop(node.input[0], None)
        if group is not None:  # else written with the first MatMul of its input
            product, initializers = _int8_product(node.input[0], group, weights)
            nodes += product
            extra += initializers
            replaced |= {matmul.input[1] for matmul in group}
    still_used = {name for node in nodes for name in node.input}
    kept = [init for init in model.graph.initializer if init.name not in replaced or init.name in still_used]
    graph = helper.make_graph(nodes, model.graph.name, model.graph.input, model.graph.output, kept + extra)
    opsets = [*model.opset_import]
    if all(opset.domain != ORT_DOMAIN for opset in opsets):
        opsets.append(helper.make_opsetid(ORT_DOMAIN, 1))
    quantized_model = helper.make_model(graph, opset_imports=opsets, ir_version=model.ir_version)
    onnx.checker.check_model(quantized_model)
    return quantized_model


def _int8_product(x: str, group: list, weights: dict) -> tuple[list, list]:
    """(nodes, initializers) computing the MatMuls `group` of input `x` in int8 (`per_token_int8`): x quantized per
    token, one MatMulIntegerToFloat by their weights side by side, the token's scale, and a Split back into the
    MatMuls' outputs when there are several."""
    from onnx import helper, numpy_helper

    scale = f"{x}/token_scale"
    nodes = [
        helper.make_node("Abs", [x], [f"{x}/abs"]),
        helper.make_node("ReduceMax", [f"{x}/abs"], [f"{x}/absmax"], axes=[-1], keepdims=1),
        helper.make_node("Max", [f"{x}/absmax", "pt_eps"], [f"{x}/absmax_eps"]),
        helper.make_node("Div", [f"{x}/absmax_eps", "pt_127"], [scale]),
        helper.make_node("Div", [x, scale], [f"{x}/scaled"]),
        helper.make_node("QuantizeLinear", [f"{x}/scaled", "pt_one", "pt_zp"], [f"{x}/uint8"]),
    ]
    parts = [numpy_helper.to_array(weights[matmul.input[1]]).astype(np.float32) for matmul in group]
    weight = np.concatenate(parts, axis=1)
    weight_scale = (np.maximum(np.abs(weight).max(axis=0), 1e-12) / 127).astype(np.float32)
    w = group[0].input[1] if len(group) == 1 else f"{x}/weights"
    initializers = [
        numpy_helper.from_array(np.round(weight / weight_scale).astype(np.int8), f"{w}/int8"),
        numpy_helper.from_array(weight_scale, f"{w}/scale"),
        numpy_helper.from_array(np.zeros(weight.shape[1], np.int8), f"{w}/zero_point"),
    ]
    out = group[0].output[0] if len(group) == 1 else f"{x}/product"
    nodes += [
        helper.make_node(
            "MatMulIntegerToFloat",
            [f"{x}/uint8", f"{w}/int8", "pt_one", f"{w}/scale", "pt_zp", f"{w}/zero_point"],
            [f"{out}/by_weight"],
            domain=ORT_DOMAIN,
        ),
        helper.make_node("Mul", [f"{out}/by_weight", scale], [out]),
    ]
    if len(group) > 1:
        initializers.append(numpy_helper.from_array(np.array([part.shape[1] for part in parts]), f"{x}/split"))
        nodes.append(helper.make_node("Split", [out, f"{x}/split"], [m.output[0] for m in group], axis=-1))
    return nodes, initializers


def trace_pieces(model: nn.Module) -> Traced:
    """The model's pieces traced to ONNX: the embeddings, each layer (fp32, with constant reshape targets, and its
    per-token int8 rewrite) and each exit head."""
    import onnx

    ids = torch.ones(2, 8, dtype=torch.long)
    hidden = torch.randn(2, 8, model.config.hidden_size)
    embeddings = rename_output(
        _export(_Embeddings(model), (ids, ids * 0), ["input_ids", "token_type_ids"], ["hidden_out"]),
        "hidden_out",
        "embedded",
    )
    layers: dict[str, list] = {"fp32": [], "int8": []}
    exits = {}
    for index in range(model.exit_layers[-1]):
        layer = static_reshapes(_export(_Layer(model, index), (hidden, ids), ["hidden", "mask"], ["hidden_out"]))
        layers["fp32"].append(layer)
        layers["int8"].append(per_token_int8(layer))
        if index + 1 in model.exit_layers:
            outputs = ["representation", "logits"]
            exits[index + 1] = static_reshapes(
                _export(_Exit(model, index + 1), (hidden, ids), ["hidden", "mask"], outputs)
            )
    return Traced(embeddings, layers, exits, OPSET, embeddings.ir_version or onnx.IR_VERSION)


def write_pieces(traced: Traced, directory: Path) -> dict:
    """The ONNX steps of the `traced` model under `directory/onnx`, one per layer and precision: [embeddings →]
    layer → [exit]; returns the manifest's `pieces`."""
    import onnx

    make_dirs(directory / ONNX_DIR)
    count = len(traced.layers["fp32"])
    pieces: dict = {"steps": {"fp32": [], "int8": []}, "step_exits": [], "shared": [f"{ONNX_DIR}/{WORD_EMBEDDINGS}"]}
    for index in range(count):
        exit_head = exit_on_rows(copy.deepcopy(traced.exits[index + 1])) if index + 1 in traced.exits else None
        for precision in ("fp32", "int8"):
            layer = traced.layers[precision][index]
            step = _step(traced.embeddings if index == 0 else None, layer, exit_head, last=index + 1 == count)
            if index == 0:
                table = externalize(step, WORD_EMBEDDINGS_WEIGHT, WORD_EMBEDDINGS)
                if precision == "fp32":
                    (directory / ONNX_DIR / WORD_EMBEDDINGS).write_bytes(table)
            onnx.save(step, str(directory / step_file(index, precision)))
            pieces["steps"][precision].append(step_file(index, precision))
        pieces["step_exits"].append(index + 1 if exit_head is not None else None)
    return pieces


def write_single_files(
    traced: Traced, model: nn.Module, directory: Path, setting: EarlyExitSetting, lte_head: Any, max_length: int
) -> dict:
    """The one-file early-exit models (`onnx_single`), fp32 and int8, under `directory`; returns the manifest's
    `single_file` entry."""
    import onnx

    plan = rule_plan(setting, model.config.num_labels, lte_head)
    metadata = single_metadata(model.config, setting, plan, sorted(traced.exits), max_length)
    for precision, name in SINGLE_FILES.items():
        onnx.save(single_file(traced, precision, plan, model.config, metadata), str(directory / name))
    return {"format": SINGLE_FORMAT, "files": dict(SINGLE_FILES), **metadata}


def _step(embeddings: Any, layer: Any, exit_head: Any, last: bool) -> Any:
    """One layer call as one graph: the embeddings ahead of the first layer, the exit head on top of a layer that
    has one; outputs the layer's hidden states (but after the last layer), the exit's representation and logits."""
    step = layer
    if embeddings is not None:
        step = join(embeddings, step, "layer/", {"hidden": "embedded", "mask": "mask"}, ["hidden_out"])
    if exit_head is not None:
        outputs = ["representation", "logits"] if last else ["hidden_out", "representation", "logits"]
        step = join(step, exit_head, "exit/", {"hidden": "hidden_out", "mask": "mask"}, outputs)
    return step


def check_export_length(config: dict, directory: Path, max_length: object) -> None:
    """`--max-length` a whole number within what the model embeds (1..max_position_embeddings), before any work."""
    limit = int(config.get("max_sequence_length") or config.get("max_position_embeddings") or 512)
    whole = isinstance(max_length, int) and not isinstance(max_length, bool)
    if not whole or not 1 <= max_length <= limit:
        raise ConfigError(f"--max-length {max_length}: {directory} embeds 1..{limit} positions (tokens per input)")


def export_onnx(
    model_dir: str | Path,
    output: str | Path,
    *,
    max_length: int,
    overwrite: bool = False,
    lte_head: Any = None,
    setting: EarlyExitSetting | None = None,
) -> dict:
    """Write `model_dir` (a fine-tuned RUN/best, typically after `save-early-exit`) as ONNX pieces and the one-file
    early-exit models at `output`, whole or not at all (written beside it, renamed, sealed). The one file's rule is
    `setting` (default: the model's saved one, else static, the full model); `lte_head`: the `LearnedExitHead` of an
    `lte` setting. Returns the manifest."""
    output = check_output(output, ONNX_OUTPUT, [("--model", model_dir)], overwrite)
    directory = Path(model_dir)
    raw = read_config(directory)
    check_export_length(raw, directory, max_length)
    given = setting is not None and setting.strategy != "lte"  # the export's config.json then carries it
    if setting is None:  # a saved setting must be one a config can carry, before any work
        saved = raw.get("early_exit") or {"strategy": "static"}
        setting = EarlyExitSetting.from_dict(saved, source=f"{directory / 'config.json'}: early_exit")
    try:
        import onnx  # noqa: F401
    except ImportError as err:
        raise ConfigError("export --layout onnx needs onnx and onnxruntime: pip install '.[export]'") from err
    model = load_finetuned(directory, require_trained=True, purpose="an early-exit export").eval()
    setting.validated(model.config.num_labels, num_exits=len(model.exit_layers))
    manifest = {
        "format": FORMAT,
        "opset": OPSET,
        "source": str(directory),
        "exit_layers": list(model.exit_layers),
        "exit_type": model.config.exit_type,
        "max_length": int(max_length),
        "precisions": ["fp32", "int8"],
        "int8": INT8_SCHEME,
        "steps": "one per layer: [embeddings ->] layer -> [exit]; inputs (input_ids, token_type_ids | hidden), mask "
        "[, exit_rows]; outputs [hidden_out], [representation, logits]",
    }
    try:
        with removed_on_failure(output.parent) as parent:
            make_dirs(parent)
            with atomic_path(output) as tmp:
                with torch.inference_mode(False), torch.no_grad():
                    traced = trace_pieces(model)
                    manifest["pieces"] = write_pieces(traced, tmp)
                    manifest["single_file"] = write_single_files(traced, model, tmp, setting, lte_head, max_length)
                atomic_write_json(tmp / MANIFEST, manifest)
                shutil.copy2(directory / "config.json", tmp / "config.json")
                if given:  # what the one file runs is the setting `predict` finds in the export
                    atomic_write_json(tmp / "config.json", {**raw, "early_exit": setting.to_dict()})
                copy_tokenizer_files(directory, tmp)
                seal(tmp)
    except OSError as err:
        raise ConfigError(f"{output}: cannot write the export ({describe_write_error(err)}); nothing was kept") from err
    return manifest
