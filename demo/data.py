"""Where the demo's data comes from, best first:

1. `../shared/data` beside the checkout (this project's CI and dev machines): Gutenberg books + GLUE SST-2 tsvs;
2. the Hugging Face hub, through the standard cache (`$HF_HOME/hub`): GLUE SST-2 (`nyu-mll/glue`, parquet) and
   WikiText-2 (`Salesforce/wikitext`, raw, ~2 M words: more than the
   demo's largest scale uses), fetched once with the hub's progress bars and read
   with `datasets`; a later run — offline too (`HF_HUB_OFFLINE=1`) — finds them in the cache;
3. a toy fallback when neither is available: installed packages' descriptions as the corpus and a template
   sentiment task. It runs every stage, but its scores mean nothing; the console and the report say so.
"""

from __future__ import annotations

import os
import random
import site
import socket
from dataclasses import dataclass
from pathlib import Path

from common.hub import hub_cache_dir, offline

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
GLUE_REPO, GLUE_FILES = "nyu-mll/glue", ["sst2/train-*.parquet", "sst2/validation-*.parquet"]
CORPUS_REPO, CORPUS_FILES = "Salesforce/wikitext", ["wikitext-2-raw-v1/train-*.parquet"]
HOW_TO_GET_REAL_DATA = (
    "for real data, run once with internet access (SST-2 and WikiText-2 are fetched into the Hugging Face cache), "
    "or put the repository's ../shared/data beside the checkout"
)


@dataclass(frozen=True)
class DemoData:
    corpus: list[str]  # data_prep inputs
    corpus_source: str
    glue_dir: str  # a folder holding SST-2/{train,dev}.tsv
    task_source: str
    origin: str  # "shared" | "hub" | "toy"

    @property
    def is_toy(self) -> bool:
        return self.origin == "toy"


def demo_data(out: Path, books: int, train_examples: int) -> DemoData:
    """The best data available here (see the module docstring)."""
    shared = shared_data(books, train_examples)
    if shared is not None:
        return shared
    hub = hub_data(out / "hub_data", train_examples)
    if hub is not None:
        return hub
    return toy_data(out / "toy_data")


def shared_data(books: int, train_examples: int) -> DemoData | None:
    gutenberg = sorted((SHARED / "corpus" / "gutenberg").glob("*.txt"))
    glue = SHARED / "glue"
    if not gutenberg or not (glue / "SST-2" / "train.tsv").is_file():
        return None
    picked = [str(p) for p in gutenberg[:books]]
    return DemoData(
        picked,
        f"{len(picked)} Project Gutenberg books from {SHARED / 'corpus' / 'gutenberg'}",
        str(glue),
        f"GLUE SST-2 from {glue} ({train_examples} training sentences)",
        "shared",
    )


def hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP check, so that a machine without internet falls back in seconds instead of timing out per file."""
    if offline():
        return False
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def fetch(repo: str, patterns: list[str], local_only: bool) -> Path | None:
    """The dataset repo's files matching `patterns` from the hub cache (downloaded first when allowed), or None."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        path = Path(
            snapshot_download(
                repo,
                repo_type="dataset",
                allow_patterns=patterns,
                cache_dir=str(hub_cache_dir()),
                local_files_only=local_only,
            )
        )
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError):
        return None
    return path if all(any(path.glob(p)) for p in patterns) else None


def read_parquet(files: list[Path]) -> object:
    """The rows of local parquet files as a `datasets.Dataset` (no network: the packaged parquet builder)."""
    import datasets

    return datasets.load_dataset("parquet", data_files=[str(f) for f in files], split="train")


def hub_data(work: Path, train_examples: int) -> DemoData | None:
    """SST-2 and WikiText-2 through the hub cache, written out in the layouts data_prep and finetune read."""
    local_only = not hub_reachable()
    glue = fetch(GLUE_REPO, GLUE_FILES, local_only)
    corpus = fetch(CORPUS_REPO, CORPUS_FILES, local_only)
    if glue is None or corpus is None:
        return None
    task_dir = work / "glue" / "SST-2"
    task_dir.mkdir(parents=True, exist_ok=True)
    for split, pattern in (("train", GLUE_FILES[0]), ("dev", GLUE_FILES[1])):
        rows = read_parquet(sorted(glue.glob(pattern)))
        lines = ["sentence\tlabel"] + [f"{r['sentence'].strip()}\t{int(r['label'])}" for r in rows]
        (task_dir / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    text = work / "wikitext-2.txt"
    with text.open("w", encoding="utf-8") as f:  # WikiText keeps paragraphs as lines; blank lines separate them
        for row in read_parquet(sorted(corpus.glob(CORPUS_FILES[0]))):
            f.write(row["text"].strip() + "\n\n" if row["text"].strip() else "")
    cache = hub_cache_dir()
    return DemoData(
        [str(text)],
        f"WikiText-2 from the Hugging Face hub, cached in {cache}",
        str(task_dir.parent),
        f"GLUE SST-2 from the Hugging Face hub ({train_examples} training sentences), cached in {cache}",
        "hub",
    )


def toy_data(work: Path) -> DemoData:
    """Package descriptions as a corpus and a template sentiment task: every stage runs, nothing is measured."""
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "package_descriptions.txt"
    texts = []
    for root in site.getsitepackages():
        for path in sorted(Path(root).glob("*.dist-info/METADATA"))[:400]:
            body = path.read_text(errors="replace").split("\n\n", 1)[-1]
            if len(body.split()) > 200:
                texts.append(body.strip())
    corpus.write_text("\n\n".join(texts), encoding="utf-8")
    rng = random.Random(0)
    subjects = ["the film", "this book", "the meal", "our trip", "the concert", "the new phone", "the service"]
    good = ["was wonderful", "felt warm and funny", "is a delight", "exceeded every hope", "was simply great"]
    bad = ["was dreadful", "felt dull and slow", "is a mess", "disappointed everyone", "was simply awful"]
    task_dir = work / "glue" / "SST-2"
    task_dir.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 400), ("dev", 120)):
        rows = ["sentence\tlabel"]
        for _ in range(n):
            label = rng.randint(0, 1)
            rows.append(f"{rng.choice(subjects)} {rng.choice(good if label else bad)} .\t{label}")
        (task_dir / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return DemoData(
        [str(corpus)],
        f"TOY corpus: descriptions of installed Python packages ({corpus})",
        str(task_dir.parent),
        f"TOY task: template sentences in SST-2 format ({task_dir}); every exit "
        "can reach 100 %, so its scores say nothing",
        "toy",
    )
