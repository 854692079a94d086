"""Hub names resolve through the standard cache, offline, with a cache the test lays out itself."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hub_cache import add_to_hub_cache

from common.errors import UserError
from common.hub import HubError, hub_cache_dir, is_hub_id, resolve_pretrained


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf" / "hub"


def test_a_cached_hub_name_resolves_offline_to_its_snapshot(offline_hub):
    snapshot = add_to_hub_cache(offline_hub, "fnlp/elasticbert-base", {"config.json": b"{}", "vocab.txt": b"[PAD]\n"})
    assert hub_cache_dir() == offline_hub
    resolved = resolve_pretrained("fnlp/elasticbert-base")
    assert resolved == snapshot and (resolved / "vocab.txt").read_bytes() == b"[PAD]\n"
    assert resolve_pretrained("fnlp/elasticbert-base") == snapshot  # idempotent, nothing downloaded


def test_a_local_directory_wins_over_a_hub_name(offline_hub, tmp_path, monkeypatch):
    add_to_hub_cache(offline_hub, "bert-base-uncased", {"config.json": b"{}"})
    local = tmp_path / "work" / "bert-base-uncased"
    local.mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "work")
    assert resolve_pretrained("bert-base-uncased").resolve() == local.resolve()


def test_offline_and_not_cached_says_how_to_get_it(offline_hub):
    with pytest.raises(
        HubError,
        match=r"--model bert-base-uncased: not a local directory and not in the Hugging "
        r"Face cache .*offline mode is on.*`hf download",
    ) as err:
        resolve_pretrained("bert-base-uncased", what="--model")
    assert isinstance(err.value, UserError)
    # the command it names is the one huggingface_hub installs (2.x has `hf` only, no `huggingface-cli`)
    command = str(err.value).split("`")[1].split()[0]
    assert (Path(sys.executable).parent / command).is_file(), command


def test_paths_that_are_not_hub_ids_are_reported_as_missing_directories(offline_hub, tmp_path):
    for name in (str(tmp_path / "nope"), "./nope", "a/b/c"):
        assert not is_hub_id(name)
        with pytest.raises(HubError, match="no such directory"):
            resolve_pretrained(name)
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(HubError, match="is a file"):
        resolve_pretrained(tmp_path / "f.txt")
