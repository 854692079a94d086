"""The demo's data, best first: ../shared/data, else the Hugging Face hub through its cache (tested offline with a
cache laid out here in the hub format), else a toy fallback that says it is one."""

from __future__ import annotations

import io

import pytest
from hub_cache import add_to_hub_cache

import demo.data as demo_data_module
from demo.data import demo_data
from finetune.tasks import load_split


def parquet_bytes(rows: dict[str, list]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table(rows), buffer)
    return buffer.getvalue()


@pytest.fixture
def no_shared_data_offline(tmp_path, monkeypatch):
    monkeypatch.setattr(demo_data_module, "SHARED", tmp_path / "no_shared_data")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf" / "hub"


def test_the_hub_path_reads_sst2_and_wikitext_from_the_cache_offline(no_shared_data_offline, tmp_path):
    cache = no_shared_data_offline
    sentences = ["a gripping , funny film", "dull and far too long", "warm", "a mess"]
    add_to_hub_cache(
        cache,
        "nyu-mll/glue",
        {
            "sst2/train-00000-of-00001.parquet": parquet_bytes(
                {"sentence": sentences, "label": [1, 0, 1, 0], "idx": [0, 1, 2, 3]}
            ),
            "sst2/validation-00000-of-00001.parquet": parquet_bytes(
                {"sentence": ["lovely", "awful"], "label": [1, 0], "idx": [0, 1]}
            ),
        },
        repo_type="dataset",
    )
    add_to_hub_cache(
        cache,
        "Salesforce/wikitext",
        {
            "wikitext-2-raw-v1/train-00000-of-00001.parquet": parquet_bytes(
                {"text": [" = Valkyria Chronicles = \n", "", " The game began development in 2010 . \n", ""]}
            ),
        },
        repo_type="dataset",
    )
    data = demo_data(tmp_path / "out", books=2, train_examples=4)
    assert data.origin == "hub" and not data.is_toy and "Hugging Face hub" in data.task_source
    train = load_split("SST-2", data.glue_dir, "train")
    assert [e.text_a for e in train] == sentences and [e.label for e in train] == [1, 0, 1, 0]
    assert [e.label for e in load_split("SST-2", data.glue_dir, "dev")] == [1, 0]
    text = open(data.corpus[0], encoding="utf-8").read()
    assert "Valkyria Chronicles" in text and "development in 2010" in text and "\n\n" in text


def test_nothing_cached_and_offline_gives_the_labelled_toy_fallback(no_shared_data_offline, tmp_path):
    data = demo_data(tmp_path / "out", books=2, train_examples=4)
    assert data.is_toy and data.corpus_source.startswith("TOY") and data.task_source.startswith("TOY")
    assert len(load_split("SST-2", data.glue_dir, "train")) == 400


def test_shared_data_comes_first_when_present():
    if not (demo_data_module.SHARED / "glue" / "SST-2" / "train.tsv").is_file():
        pytest.skip("[needs-data] ../shared/data is not beside the checkout")
    data = demo_data(demo_data_module.REPO / "unused", books=2, train_examples=4)
    assert data.origin == "shared" and len(data.corpus) == 2
