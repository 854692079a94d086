"""`common.outputs.check_output`, the one rule of every `--output` (issue 47), on folders and files built here; and
numpy's errno-less short write read as the OSError it stands for."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
from faults import small_tmpfs

from common.errors import describe_os_error, os_error_of
from common.outputs import (
    MODEL_DIRECTORY,
    RESULTS,
    Output,
    OutputError,
    check_output,
    first_json_line_has,
    folder_kind,
)

FILE = Output("predict", "a JSONL file of predictions", own=lambda p: first_json_line_has(p, ("label",)))
EXPORT = Output(
    "export", "an export", folder=True, whole=True, own=lambda p: (p / "mark").is_file(), accepts=(MODEL_DIRECTORY,)
)
RESULT = Output("evaluate", "an evaluation", folder=True, accepts=RESULTS)
RUN = Output("train", "a run directory", folder=True, exclusive=True)


def model_dir(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"x")
    return path


def refused(*args, **kwargs) -> str:
    with pytest.raises(OutputError) as raised:
        check_output(*args, **kwargs)
    return str(raised.value)


def test_folders_are_known_by_the_files_that_mark_them(tmp_path):
    assert folder_kind(model_dir(tmp_path / "m")).startswith("a model directory [config.json, model.safetensors]")
    (tmp_path / "ckpt" / "global_step3").mkdir(parents=True)
    assert folder_kind(tmp_path / "ckpt").startswith("a pre-training checkpoint folder")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run_config.json").write_text("{}")
    assert folder_kind(tmp_path / "run").startswith("a fine-tuning run directory")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("mine")
    assert folder_kind(tmp_path / "plain") is None and folder_kind(tmp_path / "missing") is None


def test_a_file_output_is_never_a_folder_and_never_the_input(tmp_path):
    model = model_dir(tmp_path / "m")
    plain = tmp_path / "plain"
    plain.mkdir()
    assert "is a folder; predict writes one file" in refused(plain, FILE, overwrite=True)
    assert f"e.g. {plain / 'predictions.jsonl'}" in refused(plain, FILE, overwrite=True)
    assert "name a file, outside it" in refused(model, FILE, overwrite=True)  # no advice to write into the model
    link = tmp_path / "link"
    link.symlink_to(model, target_is_directory=True)
    assert "is the input --model" in refused(link, FILE, [("--model", model)], overwrite=True)
    assert "is inside the input --model" in refused(link / "p.jsonl", FILE, [("--model", model)])
    texts = tmp_path / "in.txt"
    texts.write_text("a\n")
    os.link(texts, tmp_path / "hard.jsonl")
    assert "is the input --input" in refused(tmp_path / "hard.jsonl", FILE, [("--input", texts)], overwrite=True)


def test_overwrite_replaces_only_the_commands_own_file(tmp_path):
    mine, theirs, empty = tmp_path / "mine.jsonl", tmp_path / "theirs.jsonl", tmp_path / "empty.jsonl"
    mine.write_text('{"label": "1"}\n')
    theirs.write_text('{"notes": 1}\n')
    empty.write_bytes(b"")
    assert "pass --overwrite" in refused(mine, FILE)
    assert check_output(mine, FILE, overwrite=True) == mine
    assert "is not a JSONL file of predictions" in refused(theirs, FILE, overwrite=True)
    assert "an empty file" in refused(empty, FILE) and check_output(empty, FILE, overwrite=True) == empty


def test_a_folder_output_is_never_another_commands_folder_nor_a_holder_of_its_inputs(tmp_path):
    model = model_dir(tmp_path / "m")
    other = model_dir(tmp_path / "other")
    assert "is a model directory" in refused(other, RESULT)
    assert "that is not an export written by export" in refused(other, EXPORT, overwrite=True)
    (other / "mark").write_text("")
    assert "pass --overwrite" in refused(other, EXPORT) and check_output(other, EXPORT, overwrite=True) == other
    assert "holds the input --model" in refused(tmp_path, EXPORT, [("--model", model)], overwrite=True)
    assert "holds the input --config" in refused(tmp_path, RUN, [("--config", model / "config.json")])
    assert check_output(tmp_path / "new", RUN, [("--model", model)]) == tmp_path / "new"
    assert "is a file; train writes a folder" in refused(model / "config.json", RUN)
    assert "is inside the input --data-dir" in refused(tmp_path / "m" / "x", RUN, [("--data-dir", model)])


def test_numpys_short_write_is_the_oserror_it_stands_for(tmp_path):
    """numpy's `save` on a full disk raises OSError("N requested and M written") without an errno: printed with a
    file name it read `[Errno None] None` (issue 47, dedup). It is ENOSPC on a full filesystem, else EIO."""
    short = OSError("100000 requested and 2032 written")
    elsewhere = os_error_of(short, tmp_path / "x.npy")
    assert elsewhere.errno == errno.EIO and elsewhere.filename == str(tmp_path / "x.npy")
    with small_tmpfs(tmp_path / "disk", "64k") as disk:
        with pytest.raises(OSError) as raised, open(disk / "big.npy", "wb") as handle:
            np.save(handle, np.zeros(100_000), allow_pickle=False)
        mapped = os_error_of(raised.value, disk / "big.npy")
        line = describe_os_error(mapped)
        assert mapped.errno == errno.ENOSPC and "[Errno None]" not in line
        assert line.startswith(f"{disk / 'big.npy'}: No space left on device (ENOSPC")
