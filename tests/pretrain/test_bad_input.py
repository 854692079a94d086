"""Bad input fails fast (before any process group), with exit code 2 and a message that says what to fix."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
from pretrain_testlib import REPO, TINY, train_args

from pretrain.__main__ import main


def run_main(args, capsys):
    code = main(args)
    err = capsys.readouterr().err
    return code, err


@pytest.fixture
def data_copy(prepared_gutenberg, tmp_path):
    dst = tmp_path / "corpus"
    shutil.copytree(prepared_gutenberg, dst, ignore=shutil.ignore_patterns("index_cache"))
    return dst


def test_config_errors_exit_2_without_traceback(tmp_path, prepared_gutenberg, capsys, clean_env):
    code, err = run_main(
        train_args(TINY, tmp_path / "r", prepared_gutenberg, ["optim.lrr=1", "exits.groups=[[1,4]]"]), capsys
    )
    assert code == 2
    assert "unknown key 'optim.lrr' (did you mean 'optim.lr'?)" in err and "exits.groups miss layers [2, 3]" in err
    assert "Traceback" not in err
    assert not (tmp_path / "r").exists(), "nothing is created for an invalid config"


def test_missing_data_dir(tmp_path, capsys, clean_env):
    code, err = run_main(train_args(TINY, tmp_path / "r", tmp_path / "nope", []), capsys)
    assert code == 2 and "prepared corpus directory not found" in err and str(tmp_path / "nope") in err


def test_truncated_shard(data_copy, tmp_path, capsys, clean_env):
    shard = sorted((data_copy / "train").glob("*.bin"))[0]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 64)
    code, err = run_main(train_args(TINY, tmp_path / "r", data_copy, []), capsys)
    assert code == 2 and "truncated" in err and shard.name in err


def test_corrupted_tokens_caught_by_verify(data_copy, tmp_path, capsys, clean_env):
    from data_prep.verify import verify_dir

    shard = sorted((data_copy / "train").glob("*.bin"))[0]
    with open(shard, "r+b") as f:  # same size, different bytes: only a re-hash notices
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0x01]))
    code, err = run_main(train_args(TINY, tmp_path / "r", data_copy, []), capsys)
    assert code == 2 and "failed data_prep verify" in err
    for problem in verify_dir(data_copy):  # verify's own messages, verbatim
        assert problem in err


def test_verification_is_stamped_once_per_corpus_version(data_copy, tmp_path, capsys, clean_env):
    from pretrain.config import load_config
    from pretrain.corpora import open_data

    cfg = load_config(TINY, [f"data.corpora.0.path={data_copy}"])
    open_data(cfg, tmp_path, need_valid=False)
    stamps = list((data_copy / "index_cache").glob("verified_*.json"))
    assert len(stamps) == 1
    (data_copy / "manifest.json").touch()  # a changed file (mtime) means another version: verify again
    open_data(cfg, tmp_path, need_valid=False)
    assert len(list((data_copy / "index_cache").glob("verified_*.json"))) == 2


def test_run_dir_not_writable(prepared_gutenberg, tmp_path, capsys, clean_env):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, err = run_main(train_args(TINY, blocker / "run", prepared_gutenberg, []), capsys)
    assert code == 74 and f"{blocker}: Not a directory (ENOTDIR: a file stands where a folder" in err  # its claim


def test_missing_ds_config_and_fp16_on_cpu(prepared_gutenberg, tmp_path, capsys, clean_env):
    args = train_args(TINY, tmp_path / "r", prepared_gutenberg, [])
    code, err = run_main(args + ["--ds-config", str(tmp_path / "nope.json")], capsys)
    assert code == 2 and "nope.json does not exist" in err
    code, err = run_main(args + ["--ds-config", "ds_configs/zero2_fp16.json"], capsys)
    assert code == 2 and "fp16 is not supported by DeepSpeed on CPU" in err


def test_world_size_that_does_not_divide_the_batch(prepared_gutenberg, tmp_path, capsys, clean_env, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    code, err = run_main(train_args(TINY, tmp_path / "r", prepared_gutenberg, []), capsys)
    assert code == 2 and "micro_batch_size × world_size = 4 × 3" in err


def test_export_of_something_that_is_not_a_checkpoint(tmp_path, capsys):
    code, err = run_main(["export", "--checkpoint", str(tmp_path), "--output", str(tmp_path / "hf")], capsys)
    assert code == 2 and "no 'latest' file" in err and err.startswith("pretrain: error: ")


def test_build_index_opens_the_data_without_the_trainer(data_copy, tmp_path):
    """`build-index` verifies, stamps and caches offline: no trainer, no DeepSpeed imported."""
    argv = [
        "build-index",
        "--config",
        str(TINY),
        "--output",
        str(tmp_path / "run"),
        "--set",
        f"data.corpora.0.path={data_copy}",
    ]
    code = (
        f"import sys; from pretrain.__main__ import main; rc = main({argv!r}); "
        "loaded = [m for m in ('pretrain.trainer', 'deepspeed') if m in sys.modules]; "
        "assert not loaded, loaded; sys.exit(rc)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and "sample_index_train_" in lines[0] and "sample_index_valid_" in lines[1]
    assert list((data_copy / "index_cache").glob("verified_*.json"))


def test_blended_corpora_must_share_a_tokenizer(prepared_gutenberg, tmp_path, clean_env):
    """Two corpora with the same tokenizer blend; one prepared with another vocabulary is refused by name."""
    from pretrain_testlib import BOOKS, GUTENBERG

    from data_prep.pipeline import tokenize_corpus
    from data_prep.tokenizer import train_tokenizer
    from pretrain.config import ConfigError, load_config
    from pretrain.corpora import open_data

    both = load_config(
        TINY, [f"data.corpora=[{{path: {prepared_gutenberg}, weight: 3}}, {{path: {prepared_gutenberg}, weight: 1}}]"]
    )
    bundle = open_data(both, tmp_path, need_valid=True)
    assert len(bundle.train) == 2 and len(bundle.valid) == 2 and len(bundle.train[0]) == len(bundle.train[1])

    text = (GUTENBERG / BOOKS[1]).read_text(encoding="utf-8")
    train_tokenizer([text], tmp_path / "tok", vocab_size=500)
    other = tmp_path / "other"
    tokenize_corpus([str(GUTENBERG / BOOKS[1])], other, tokenizer=tmp_path / "tok", valid_fraction=0.1)
    mixed = load_config(TINY, [f"data.corpora=[{{path: {prepared_gutenberg}}}, {{path: {other}}}]"])
    refusal = r"the tokenizer of data.corpora\[1\] .* is not the tokenizer of data.corpora\[0\] .*blended corpora"
    with pytest.raises(ConfigError, match=refusal):
        open_data(mixed, tmp_path, need_valid=False)


def test_unreadable_inputs_of_every_command_are_one_line_errors(tmp_path, capsys, clean_env):
    """A config that is not UTF-8, a DeepSpeed JSON that is not UTF-8, a world size of 0, a hub name that is not
    cached: each command says which file or key, exits 2, no traceback."""
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"model:\n  hidden_size: \xff\xfe\n")
    for argv in (["check-config", "--config", str(binary)], ["build-index", "--config", str(binary)]):
        code, err = run_main(argv, capsys)
        assert code == 2 and f"{binary}: not UTF-8 text" in err and "Traceback" not in err
    ds = tmp_path / "ds.json"
    ds.write_bytes(b"\xff{}")
    code, err = run_main(
        ["check-config", "--config", str(TINY), "--ds-config", str(ds), "--precision-for", "cpu"], capsys
    )
    assert code == 2 and f"{ds}: not UTF-8 text" in err and "the DeepSpeed config" in err
    code, err = run_main(["check-config", "--config", str(TINY), "--world-size", "0"], capsys)
    assert code == 2 and "--world-size=0 must be >= 1" in err


def test_an_uncached_hub_name_fails_before_any_process_group(
    prepared_gutenberg, tmp_path, capsys, clean_env, monkeypatch
):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = train_args(TINY, tmp_path / "r", prepared_gutenberg, ["model.init_from=bert-base-uncased"])
    code, err = run_main(args, capsys)
    assert (
        code == 2
        and "model.init_from bert-base-uncased: not a local directory and not in the Hugging Face cache" in err
    )
    assert "Traceback" not in err and not (tmp_path / "r" / "config.yaml").exists()


def test_a_stale_extension_build_lock_is_refused_not_waited_on(
    tmp_path, prepared_gutenberg, capsys, clean_env, monkeypatch
):
    """A lock left by a killed DeepSpeed op build makes torch's file baton spin forever: refused at start with the
    file named; a fresh lock (a build running now) is left to torch."""
    from pretrain.guards import stale_build_locks

    ext = tmp_path / "torch_extensions"
    stale, fresh = ext / "deepspeed_shm_comm" / "lock", ext / "fused_adam" / "lock"
    for lock in (stale, fresh):
        lock.parent.mkdir(parents=True)
        lock.touch()
    hour_ago = time.time() - 3600
    os.utime(stale, (hour_ago, hour_ago))
    assert stale_build_locks(ext) == [stale]
    default_layout = tmp_path / "default_root" / f"py{sys.version_info.major}{sys.version_info.minor}_cpu"
    (default_layout / "x").mkdir(parents=True)
    (default_layout / "x" / "lock").touch()
    os.utime(default_layout / "x" / "lock", (hour_ago, hour_ago))
    assert stale_build_locks(tmp_path / "default_root") == [default_layout / "x" / "lock"]

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(ext))
    code, err = run_main(train_args(TINY, tmp_path / "r", prepared_gutenberg, []), capsys)
    assert code == 2 and str(stale) in err and f"rm {stale}" in err and "Traceback" not in err
    assert str(fresh) not in err
    assert not (tmp_path / "r").exists(), "refused before the run directory is made"
