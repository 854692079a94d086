"""Writing our models in the released ElasticBERT layout (`--layout fnlp`), for the official code.

The official fine-tuning and inference code (fastnlp/ElasticBERT: `finetune-static/models/modeling_elasticbert.py`,
`finetune-dynamic/models/modeling_elasticbert_entropy.py` / `..._patience.py`, on transformers 4.x) cannot use our
directories: our heads are `exits.{l}.classifier.*`, our config's `num_output_layers` (the layer count) sends its
static class down its multi-output path, and its transformers reads `pytorch_model.bin` only. What its classes can
run, and so what is written (key names from `layouts`, the one place that knows the layout):

- a classifier with one linear exit, at layer m: the static class. `classifier.*`, the pooler of layer m only (the
  official encoder builds no other), `num_output_layers` 1, `num_hidden_layers` m (its static usage);
- a classifier with a linear exit on every layer 1..m (m >= 2): the dynamic classes. `classifiers.{i}.*` reading
  layer i + 1, every pooler, `num_output_layers` = `num_hidden_layers` = m (their config says so, and their
  early-exit loop runs `classifiers[i]` and `pooler[i]` at every layer i);
- a pre-trained model: the shape of the released `fnlp/elasticbert-base`, the bare encoder under `elasticbert.`
  with every layer's pooler. Our MLM/SOP heads are not written: the release has none.

Layers above a classifier's deepest exit never run in our model, so they are not written either. Anything else (MHA
exits, exits that are neither one layer nor every layer from 1 up, RoBERTa-style position ids) is refused with a
`LayoutError` saying which and why.

Files: `pytorch_model.bin` (`torch.save` of a plain dict of tensors: what transformers 4.x reads) and
`model.safetensors` with the same tensors (loading that unpickles nothing; newer transformers and our loader prefer
it); `config.json` with the official ElasticBertConfig's fields only (no `exit_layers`: `load_pretrained` places the
exits from `num_output_layers` as the official code does, so the directory reads back into our classes too; an
`early_exit` setting is dropped: the official scripts take their thresholds as arguments); tokenizer files copied.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from safetensors.torch import save_file
from transformers import PreTrainedModel

from common.errors import UserError, describe_os_error
from common.hub import TOKENIZER_FILES, resolve_pretrained
from common.integrity import seal
from common.io import atomic_path, make_dirs, peek_object, removed_on_failure, writing
from common.outputs import MODEL_DIRECTORY, Output, check_output
from common.run_dir import RunWriteError

from .configuration import ElasticBertConfig
from .layouts import (
    OFFICIAL_CONFIG_FIELDS,
    OFFICIAL_POSITION_IDS,
    OFFICIAL_PREFIX,
    apply_renames,
    layer_index,
    official_head_names,
    official_pooler_layers,
    pooler_index,
)
from .loading import LoadReport, load_pretrained, read_config
from .modeling import ElasticBertForSequenceClassification, ElasticBertModel

WEIGHTS_BIN = "pytorch_model.bin"
WEIGHTS_SAFETENSORS = "model.safetensors"
OFFICIAL_CLASSES = {
    "static": "finetune-static ElasticBertForSequenceClassification",
    "dynamic": "finetune-dynamic ElasticBertForSequenceClassification (entropy / patience)",
    "pre-trained": "the released fnlp/elasticbert-base shape",
}


class LayoutError(UserError):
    """A model the official ElasticBERT layout cannot express, or an export that cannot start (names which and
    why)."""


@dataclass(frozen=True)
class FnlpLayout:
    """What a model becomes in the official layout: which official class runs it, with how many layers/outputs."""

    kind: Literal["static", "dynamic", "pre-trained"]
    num_layers: int  # the num_hidden_layers written
    num_output_layers: int
    source_layers: int  # the model's own num_hidden_layers

    @property
    def architecture(self) -> str:
        return "ElasticBertModel" if self.kind == "pre-trained" else "ElasticBertForSequenceClassification"

    def describe(self) -> str:
        dropped = ""
        if self.num_layers < self.source_layers:
            dropped = f"; layers {self.num_layers + 1}-{self.source_layers} (above the deepest exit) are not written"
        return (
            f"fnlp layout for {OFFICIAL_CLASSES[self.kind]}: num_hidden_layers={self.num_layers}, "
            f"num_output_layers={self.num_output_layers}{dropped}"
        )


def plan_fnlp(config: ElasticBertConfig, classifier: bool, where: str = "this model") -> FnlpLayout:
    """What `config`'s model becomes in the official layout (checked before any weight is read or written); a
    LayoutError when the official classes could not run it."""
    refusal = f"{where} cannot be written in the official ElasticBERT layout"
    if getattr(config, "token_level_exit", False):  # elasticbert.hashee: its token map has no place there
        raise LayoutError(
            f"{refusal}: it is a HashEE model (token-level exit), whose token map the official ElasticBERT classes "
            "cannot hold: they would compute every token at every layer, another model. Use the directory as it is "
            "(our loaders, the Auto classes, remote code)"
        )
    if config.position_ids_style != "bert":
        raise LayoutError(
            f"{refusal}: position_ids_style={config.position_ids_style!r}, but the official embeddings number "
            "positions 0..T-1 (BERT's way), so they would compute other hidden states"
        )
    layers = config.num_hidden_layers
    if not classifier:
        return FnlpLayout("pre-trained", layers, layers, layers)
    exits = list(config.exit_layers)
    if config.exit_type != "linear":
        raise LayoutError(
            f"{refusal}: its exits at layers {exits} are exit_type={config.exit_type!r}; the official heads are "
            "linear only (pooler -> dropout -> Linear). Export a model fine-tuned with --exit-type linear"
        )
    top = exits[-1]
    if len(exits) == 1:
        return FnlpLayout("static", top, 1, layers)
    if exits == list(range(1, top + 1)):
        return FnlpLayout("dynamic", top, top, layers)
    missing = sorted(set(range(1, top + 1)) - set(exits))
    raise LayoutError(
        f"{refusal}: exits at layers {exits}, none at {missing}. The official static class has one classifier, on "
        "its top layer; the dynamic ones a classifier on every layer (num_output_layers = num_hidden_layers: their "
        "early-exit loop runs classifiers[i] and pooler[i] at every layer i). Export a model with one exit, or with "
        "an exit on every layer from 1 up (--exits all)"
    )


def fnlp_state_dict(model: PreTrainedModel, layout: FnlpLayout) -> dict[str, torch.Tensor]:
    """The official classes' state dict: the backbone under `elasticbert.` (layers up to `layout.num_layers`, the
    poolers the official encoder builds, its `position_ids` buffer) and, for a classifier, the renamed heads."""
    poolers = set(official_pooler_layers(layout.num_layers, layout.num_output_layers))
    state = {}
    for key, tensor in model.base_model.state_dict().items():
        layer, pooler = layer_index(key), pooler_index(key)
        if (layer is None or layer < layout.num_layers) and (pooler is None or pooler in poolers):
            state[OFFICIAL_PREFIX + key] = tensor
    state[OFFICIAL_POSITION_IDS] = torch.arange(model.config.max_position_embeddings).unsqueeze(0)
    if layout.kind != "pre-trained":
        heads = official_head_names(layout.num_layers, layout.num_output_layers)
        for key, tensor in model.state_dict().items():
            if key.startswith("exits."):
                renamed = apply_renames(key, heads)
                if renamed == key:  # plan_fnlp admits only exits the official heads cover
                    raise LayoutError(f"{key}: no official head for this exit ({layout.describe()})")
                state[renamed] = tensor
    return {key: tensor.detach().to("cpu").contiguous() for key, tensor in state.items()}


def fnlp_config(config: ElasticBertConfig, layout: FnlpLayout) -> dict:
    """config.json as the official ElasticBertConfig writes it: its fields, its class, the labels of a classifier."""
    ours = config.to_dict()
    fields = {name: ours[name] for name in OFFICIAL_CONFIG_FIELDS if name in ours}
    fields.update(
        num_hidden_layers=layout.num_layers,
        num_output_layers=layout.num_output_layers,
        max_output_layers=max(int(config.max_output_layers), layout.num_layers),  # its pooler list's length
        gradient_checkpointing=False,
        use_cache=True,
    )
    head = {"architectures": [layout.architecture], "model_type": "elasticbert"}
    if layout.kind != "pre-trained":
        head["id2label"] = {str(index): label for index, label in config.id2label.items()}
        head["label2id"] = {label: int(index) for label, index in config.label2id.items()}
        if config.problem_type:
            head["problem_type"] = config.problem_type
    return head | fields


def save_fnlp(model: PreTrainedModel, directory: Path, where: str = "this model") -> FnlpLayout:
    """Write `model` (a classifier, `ElasticBertForPreTraining` or `ElasticBertModel`) into `directory` in the
    official layout: weights twice (`pytorch_model.bin`, `model.safetensors`) and config.json. Callers pass a fresh
    temporary directory and rename it when complete (`export_fnlp`, `pretrain export`)."""
    classifier = isinstance(model, ElasticBertForSequenceClassification)
    layout = plan_fnlp(model.config, classifier, where)
    state = fnlp_state_dict(model, layout)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with writing(directory / WEIGHTS_BIN):  # a full disk is an OSError naming the file, not "unexpected pos"
        torch.save(state, directory / WEIGHTS_BIN)
    with writing(directory / WEIGHTS_SAFETENSORS):
        save_file(state, str(directory / WEIGHTS_SAFETENSORS), metadata={"format": "pt"})
    config = json.dumps(fnlp_config(model.config, layout), indent=2, sort_keys=True) + "\n"
    (directory / "config.json").write_text(config, encoding="utf-8")
    return layout


def copy_tokenizer_files(source: Path, directory: Path) -> list[str]:
    """The tokenizer files `source` holds (`common.hub.TOKENIZER_FILES`; the official scripts read `vocab.txt` with
    BertTokenizer), copied beside the weights; config.json is the export's own."""
    copied = []
    for pattern in TOKENIZER_FILES:
        for path in sorted(Path(source).glob(pattern)):
            if path.is_file() and path.name != "config.json":
                shutil.copy2(path, Path(directory) / path.name)
                copied.append(path.name)
    return copied


def export_fnlp(model_dir: str | Path, output: str | Path, *, overwrite: bool = False) -> FnlpLayout:
    """Write a model directory (a fine-tuned `RUN/best`, a pre-trained export, any layout `load_pretrained` reads;
    or a hub name) in the official layout at `output`, whole or not at all (written beside it, then renamed).
    Refuses an existing non-empty `output` unless `overwrite`, the model's own directory, and a model whose written
    weights would be untrained (a pre-trained directory has no classifier to export as one)."""
    output = check_output(output, FNLP_EXPORT, [("--model", model_dir)], overwrite)
    directory = resolve_pretrained(model_dir, what="--model")
    raw = read_config(directory)
    model, report = load_pretrained(_export_class(raw), directory, raw_config=raw)
    untrained = _untrained(model, report)
    if untrained:
        raise LayoutError(
            f"{directory}: {len(untrained)} weights the export would write were never trained (e.g. "
            f"{', '.join(untrained[:4])}): is this a fine-tuned model? (config.json names its class in architectures)"
        )
    try:
        with removed_on_failure(output.parent) as parent:  # folders made for the export go if it fails
            make_dirs(parent)
            with atomic_path(output) as tmp:  # torch.save's or safetensors' failed write: an OSError naming the file
                layout = save_fnlp(model, tmp, str(directory))
                copy_tokenizer_files(Path(directory), tmp)
                seal(tmp)
    except OSError as err:
        raise RunWriteError(f"{output}: cannot write the export ({describe_os_error(err)}); nothing was kept") from err
    return layout


def is_fnlp_export(directory: Path) -> bool:
    """A directory `export_fnlp` wrote: the official config (no `exit_layers`) beside pytorch_model.bin, and no
    `pretrain_info.json` (a pre-training export in this layout is `pretrain export`'s)."""
    raw = peek_object(Path(directory) / "config.json") or {}
    weights = (Path(directory) / WEIGHTS_BIN).is_file()
    return weights and "num_output_layers" in raw and "exit_layers" not in raw and not _pretrain_export(directory)


def _pretrain_export(directory: Path) -> bool:
    return (Path(directory) / "pretrain_info.json").is_file()


FNLP_EXPORT = Output(
    "export --layout fnlp",
    "a model in the official ElasticBERT layout",
    folder=True,
    whole=True,
    own=is_fnlp_export,
    accepts=(MODEL_DIRECTORY,),
)


def _export_class(raw: dict) -> type[PreTrainedModel]:
    """A classifier unless config.json names a class without one (our pre-trained exports, the fnlp release)."""
    architectures = raw.get("architectures") or []
    if not architectures or any(name.endswith("ForSequenceClassification") for name in architectures):
        return ElasticBertForSequenceClassification
    return ElasticBertModel


def _untrained(model: PreTrainedModel, report: LoadReport) -> list[str]:
    """Weights the export writes that the checkpoint did not hold (`load_pretrained` already refuses random
    embeddings and layers): a classifier's exits and their poolers; a pre-trained model's poolers."""
    if isinstance(model, ElasticBertForSequenceClassification):
        layers = model.exit_layers
        needed = tuple(f"exits.{layer}." for layer in layers)
        needed += tuple(f"{OFFICIAL_PREFIX}encoder.pooler.{layer - 1}." for layer in layers)
    else:
        needed = ("encoder.pooler.",)
    return [key for key in report.initialised if key.startswith(needed)]
