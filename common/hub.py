"""Released weights and tokenizers by name: a local directory is used as it is; anything else that looks like a
Hugging Face hub id (`bert-base-uncased`, `fnlp/elasticbert-base`) is resolved through the standard hub cache.

The cache is the one every Hugging Face library shares (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
`~/.cache/huggingface/hub`), read when the name is resolved, not at import. Offline mode (`HF_HUB_OFFLINE=1`) is
respected: a cached snapshot is used and nothing is downloaded; a name that is not cached fails with a message that
says how to get it. Only PyTorch-side files are fetched (no TF/Flax/ONNX weights).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import UserError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
# A tokenizer's own files (glob patterns), whatever its kind: WordPiece (vocab.txt), a tokenizers tokenizer.json,
# byte-level BPE (vocab.json + merges.txt), sentencepiece (*.model), and the files that configure them. The one list:
# what `tokenizer_files_in` finds (finetune: "no tokenizer files"; exports copy them beside the weights).
TOKENIZER_FILES = [
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "*.model",
    "merges.txt",
    "vocab.json",
    "added_tokens.json",
]
# What resolving a tokenizer by hub name fetches: its files and the model's config.json (AutoTokenizer reads the
# model_type there when tokenizer_config.json does not name the class; the tokenizer identity a model records).
TOKENIZER_DOWNLOAD = [*TOKENIZER_FILES, "config.json"]
SKIP_FILES = [
    "*.h5",
    "*.msgpack",
    "*.ot",
    "*.onnx",
    "onnx/*",
    "tf_model*",
    "flax_model*",
    "rust_model*",
    "coreml/*",
    "openvino/*",
    "*.tflite",
]
TRUE = ("1", "ON", "YES", "TRUE")


class HubError(UserError):
    """A model or tokenizer name that is neither a local directory nor resolvable through the hub cache."""


def hub_cache_dir() -> Path:
    """The shared hub cache, as `huggingface_hub` itself would choose it now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    return any(os.environ.get(name, "").upper() in TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def tokenizer_files_in(directory: str | os.PathLike) -> list[Path]:
    """The tokenizer files (`TOKENIZER_FILES`) `directory` holds, sorted by name ([] when none, or no directory)."""
    directory = Path(directory)
    return sorted({p for pattern in TOKENIZER_FILES for p in directory.glob(pattern) if p.is_file()})


def is_hub_id(name: str) -> bool:
    """Looks like `name` or `org/name` (and is not a path someone meant as a local directory)."""
    return bool(HUB_ID.match(name)) and not name.startswith((".", "~")) and not name.endswith("/")


def resolve_pretrained(
    name_or_path: str | os.PathLike,
    what: str = "model",
    revision: str | None = None,
    files: list[str] | None = None,
) -> Path:
    """The local directory holding `name_or_path`: itself when it exists, else its snapshot in the hub cache
    (downloaded first when online). `what` names the option in error messages (e.g. "--model"); `files` limits a
    download to those patterns (e.g. `TOKENIZER_DOWNLOAD`: a tokenizer without the model's weights)."""
    text = str(name_or_path)
    local = Path(os.path.expanduser(text))
    if local.exists():
        if not local.is_dir():
            holds = "the tokenizer's files" if "tokenizer" in what else "config.json and the weights"
            raise HubError(f"{what} {text}: is a file, not a folder; pass the directory that holds {holds}")
        return local
    if not is_hub_id(text):
        raise HubError(f"{what} {text}: no such directory (and not a Hugging Face hub name such as org/model)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    cache = hub_cache_dir()
    try:
        path = snapshot_download(
            text,
            revision=revision,
            cache_dir=str(cache),
            local_files_only=offline(),
            allow_patterns=files,
            ignore_patterns=SKIP_FILES,
        )
    except LocalEntryNotFoundError:
        hint = (
            (
                "offline mode is on (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE): run once with internet access, or "
                f"`hf download {text}` (huggingface_hub's CLI), or pass a local directory"
            )
            if offline()
            else ("the hub could not be reached: check the connection, or pass a local directory")
        )
        raise HubError(
            f"{what} {text}: not a local directory and not in the Hugging Face cache {cache}; {hint}"
        ) from None
    except RepositoryNotFoundError:
        raise HubError(
            f"{what} {text}: no such repository on the Hugging Face hub (and no local directory of "
            "that name); check the spelling, or log in for a private model"
        ) from None
    except (HfHubHTTPError, OSError) as err:
        raise HubError(f"{what} {text}: could not be fetched from the Hugging Face hub ({err})") from None
    return Path(path)
