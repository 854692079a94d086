"""The one JSON reader (`common.io`), the one file hash (`common.integrity`) and the one list of tokenizer files
(`common.hub`): every package reads, hashes and finds them through these."""

from __future__ import annotations

import hashlib

import pytest

from common.errors import UserError
from common.hub import TOKENIZER_DOWNLOAD, TOKENIZER_FILES, tokenizer_files_in
from common.integrity import sha256_bytes, sha256_file
from common.io import parse_object, peek_object, read_object


class Damaged(Exception):
    pass


def test_read_object_names_the_file_and_what_is_wrong(tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{"a": 1}')
    assert read_object(path) == {"a": 1}
    path.write_text("{")
    with pytest.raises(Damaged, match=r"r\.json:1:2: not valid JSON .*; rerun it"):
        read_object(path, Damaged, hint="rerun it")
    path.write_bytes(b"\xff{}")
    with pytest.raises(UserError, match=r"r\.json: not UTF-8 text"):
        read_object(path)
    path.write_text("[1]")
    with pytest.raises(UserError, match=r"r\.json: expected a manifest, found list"):
        read_object(path, what="a manifest")
    with pytest.raises(UserError, match=r"absent\.json: no such file"):
        read_object(tmp_path / "absent.json")
    assert read_object(tmp_path / "absent.json", missing_ok=True) == {}


def test_peek_object_is_none_for_whatever_cannot_be_read(tmp_path):
    path = tmp_path / "unit.json"
    assert peek_object(path) is None
    for broken in ("{", "[1, 2]", "null"):
        path.write_text(broken)
        assert peek_object(path) is None
    path.write_text('{"unit_key": "k"}')
    assert peek_object(path) == {"unit_key": "k"}


def test_parse_object_takes_bytes():
    assert parse_object(b'{"x": 2}', "m.json") == {"x": 2}
    with pytest.raises(UserError, match=r"m\.json: not UTF-8 text"):
        parse_object(b"\xff", "m.json")
    with pytest.raises(UserError, match=r"m\.jsonl:3: not valid JSON \(.* at column 1\)"):
        parse_object("}", "m.jsonl:3", record=True)


def test_one_file_hash(tmp_path):
    (tmp_path / "f").write_bytes(b"abc" * 1000)
    assert sha256_bytes(b"abc" * 1000) == sha256_file(tmp_path / "f") == hashlib.sha256(b"abc" * 1000).hexdigest()


def test_one_list_of_tokenizer_files(tmp_path):
    assert "config.json" not in TOKENIZER_FILES and TOKENIZER_DOWNLOAD == [*TOKENIZER_FILES, "config.json"]
    assert tokenizer_files_in(tmp_path) == [] and tokenizer_files_in(tmp_path / "absent") == []
    for name in ("config.json", "model.safetensors", "spiece.model", "vocab.txt", "tokenizer_config.json"):
        (tmp_path / name).write_text("x")
    assert [p.name for p in tokenizer_files_in(tmp_path)] == ["spiece.model", "tokenizer_config.json", "vocab.txt"]
