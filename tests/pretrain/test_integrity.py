"""Checkpoint integrity without DeepSpeed: checksums (write, verify, refuse by name), the structural check of `.pt`
files, the pruning policy (never the newest committed checkpoint), and the run directory's lock between two real
processes, including one killed with SIGKILL."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from faults import flip_bytes, truncate
from pretrain_testlib import REPO

from common.integrity import CHECKSUMS, hash_files, list_files, share_of, verify_share, write_checksums
from pretrain.checkpoint import CLIENT_STATE, LATEST, ResumeError, prune, verify_checkpoint


def _checkpoint(ckpt_dir, step, commit=True, size=1000, killed=False):
    """A stand-in tag directory: a real torch file, client state and export files, committed with checksums
    (`commit=False`: as a trainer before checksums left it; `killed`: only DeepSpeed's file, as a killed save)."""
    tag = f"global_step{step}"
    d = ckpt_dir / tag
    (d / "export").mkdir(parents=True)
    torch.save({"w": torch.arange(size, dtype=torch.float32)}, d / "mp_rank_00_model_states.pt")
    if killed:
        return tag
    (d / CLIENT_STATE).write_text(json.dumps({"step": step, "consumed_samples": 16 * step}))
    (d / "export" / "config.json").write_text("{}")
    if commit:
        write_checksums(d, hash_files(d, list_files(d)))
    return tag


def test_checksums_list_every_file_and_verify(tmp_path):
    tag = _checkpoint(tmp_path, 5)
    d = tmp_path / tag
    recorded = json.loads((d / CHECKSUMS).read_text())
    assert recorded["format"] == 1 and recorded["algorithm"] == "sha256"
    assert sorted(recorded["files"]) == [CLIENT_STATE, "export/config.json", "mp_rank_00_model_states.pt"]
    assert recorded["files"][CLIENT_STATE]["size"] == (d / CLIENT_STATE).stat().st_size
    assert verify_share(d, 0, 1) == []
    # each file is hashed by exactly one of the ranks
    names = list_files(d)
    assert sorted(n for r in range(2) for n in share_of(names, r, 2)) == names


def test_flipped_truncated_missing_and_unlisted_files_are_named(tmp_path):
    tag = _checkpoint(tmp_path, 5)
    d = tmp_path / tag
    flip_bytes(d / "mp_rank_00_model_states.pt")
    (d / "export" / "config.json").unlink()
    (d / "zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(b"stray")
    problems = verify_share(d, 0, 1)
    assert len(problems) == 3, problems
    export, model, stray = problems  # in file-name order
    assert f"{d}/export/config.json: missing (listed in checksums.json)" == export
    assert f"{d}/mp_rank_00_model_states.pt: contents differ from the sha256 in checksums.json" in model
    assert f"{d}/zero_pp_rank_1_mp_rank_00_optim_states.pt: not listed in checksums.json" in stray
    with pytest.raises(ResumeError) as e:
        verify_checkpoint(tmp_path, tag, use_checksums=True)
    assert "refusing to resume from checkpoint" in str(e.value) and "--no-verify-checksums" in str(e.value)


def test_truncation_is_named_with_or_without_checksums(tmp_path):
    tag = _checkpoint(tmp_path, 5, size=20_000)
    path = tmp_path / tag / "mp_rank_00_model_states.pt"
    full = path.stat().st_size
    truncate(path, 0.5)
    [problem] = verify_share(tmp_path / tag, 0, 1)
    assert f"{path}: {full // 2} bytes but checksums.json records {full} (truncated" in problem
    [problem] = verify_share(tmp_path / tag, 0, 1, use_checksums=False)  # the structural check still sees it
    assert f"{path}: not a complete PyTorch file" in problem


def test_a_checkpoint_without_checksums_is_refused_unless_told(tmp_path):
    tag = _checkpoint(tmp_path, 5, commit=False)
    [problem] = verify_share(tmp_path / tag, 0, 1)
    assert "checksums.json is missing" in problem
    assert verify_share(tmp_path / tag, 0, 1, use_checksums=False) == []
    (tmp_path / tag / CHECKSUMS).write_bytes(b"\xff\xfe not json")
    [problem] = verify_share(tmp_path / tag, 0, 1)
    assert "checksums.json: not UTF-8 text" in problem and "cannot be verified" in problem


def test_older_committed_checkpoints_are_offered(tmp_path):
    _checkpoint(tmp_path, 5)
    _checkpoint(tmp_path, 8, commit=False)  # a checkpoint of the trainer before checksums
    _checkpoint(tmp_path, 10, killed=True)
    tag = _checkpoint(tmp_path, 15)
    flip_bytes(tmp_path / tag / CLIENT_STATE, offset=0, count=1)
    with pytest.raises(ResumeError) as e:
        verify_checkpoint(tmp_path, tag, use_checksums=True)
    assert "Older committed checkpoints: global_step8, global_step5;" in str(e.value)  # not the killed step 10


def test_prune_keeps_the_newest_committed_checkpoints_not_the_newest_directories(tmp_path):
    """keep_last counts complete checkpoints up to `latest`: killed saves never push a good one out, checkpoints of
    the trainer before checksums still count, and directories newer than `latest` are not touched."""
    _checkpoint(tmp_path, 3, commit=False)  # written before checksums existed: complete, kept by keep_last
    for step in (5, 10):
        _checkpoint(tmp_path, step)
    for step in (15, 20):
        _checkpoint(tmp_path, step, killed=True)  # two killed saves
    (tmp_path / LATEST).write_text("global_step10")
    _checkpoint(tmp_path, 25)  # committed but `latest` never moved (killed just before)
    assert prune(tmp_path, keep_last=3) == []
    assert prune(tmp_path, keep_last=1) == ["global_step3", "global_step5"]
    assert sorted(p.name for p in tmp_path.glob("global_step*")) == [
        "global_step10",
        "global_step15",
        "global_step20",
        "global_step25",
    ]
    (tmp_path / LATEST).write_text("global_step25")
    assert prune(tmp_path, keep_last=2) == ["global_step15", "global_step20"]  # leftovers older than latest
    assert sorted(p.name for p in tmp_path.glob("global_step*")) == ["global_step10", "global_step25"]


HOLD = (
    "import sys, time; from pathlib import Path; from common.dist import DistEnv; "
    "from common.run_dir import RunLock; "
    "RunLock.acquire(Path(sys.argv[1]), DistEnv(0, 1, 0, '127.0.0.1', 1, 'none')); "
    "print('held', flush=True); time.sleep(120)"
)


def test_the_run_directory_lock_between_two_processes(tmp_path):
    """A second process is refused with the holder's pid and host; SIGKILL of the holder frees the lock at once."""
    from common.dist import DistEnv
    from common.run_dir import RunDirError, RunLock

    env = DistEnv(0, 1, 0, "127.0.0.1", 1, "none")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirError) as e:
            RunLock.acquire(tmp_path, env)
        assert f"is in use by another trainer: pid {holder.pid} on host {socket.gethostname()} (" in str(e.value)
        claim = tmp_path.parent / f".{tmp_path.name}.claim" / "0"  # the run directory's claim (common.claims)
        assert str(claim) in str(e.value) and "another --output" in str(e.value)
        with pytest.raises(RunDirError):  # rank 1 of another job: the holder is no rank of it
            RunLock.acquire(tmp_path, DistEnv(1, 2, 1, "127.0.0.1", 1, "torchrun"))
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        lock = RunLock.acquire(tmp_path, env)  # not stuck: the kernel released the dead holder's flock
        info = json.loads(claim.read_text())
        assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
        lock.release()
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_forked_worker_does_not_keep_the_lock(tmp_path):
    """DataLoader workers are forked with the lock's descriptor; they close their copy, so the lock ends with the
    trainer even while a worker lingers."""
    code = (
        "import os, sys, time; from pathlib import Path; from common.dist import DistEnv; "
        "from common.run_dir import RunLock, release_inherited_locks; "
        "RunLock.acquire(Path(sys.argv[1]), DistEnv(0, 1, 0, '127.0.0.1', 1, 'none')); "
        "pid = os.fork()\n"
        "if pid == 0:\n    release_inherited_locks(); time.sleep(60); os._exit(0)\n"
        "print(pid, flush=True); time.sleep(60)"
    )
    from common.dist import DistEnv
    from common.run_dir import RunLock

    trainer = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    worker = int(trainer.stdout.readline())
    try:
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait(timeout=30)
        deadline = time.time() + 10
        while True:
            try:
                RunLock.acquire(tmp_path, DistEnv(0, 1, 0, "127.0.0.1", 1, "none")).release()
                break
            except Exception:
                assert time.time() < deadline, "the forked worker kept the lock"
                time.sleep(0.1)
    finally:
        os.kill(worker, signal.SIGKILL)


def test_the_built_model_must_have_the_checkpoints_weight_shapes(tmp_path):
    """What the config comparison cannot see (model.init_from changed, another vocabulary) is caught against the
    checkpoint's export/config.json, naming the key and the checkpoint."""
    import types

    from pretrain.checkpoint import check_architecture

    tag = _checkpoint(tmp_path, 5)
    (tmp_path / tag / "export" / "config.json").write_text(json.dumps({"hidden_size": 64, "vocab_size": 30522}))
    check_architecture(tmp_path, tag, types.SimpleNamespace(hidden_size=64, vocab_size=30522))
    with pytest.raises(ResumeError) as e:
        check_architecture(tmp_path, tag, types.SimpleNamespace(hidden_size=384, vocab_size=30522))
    assert f"checkpoint {tmp_path / tag} cannot be loaded into this model" in str(e.value)
    assert "hidden_size=64 in the checkpoint but 384 in this run (model.hidden_size)" in str(e.value)


def test_a_resume_onto_tokens_of_another_tokenizer_is_refused(tmp_path):
    """The checkpoint `latest` names records the tokenizer its weights were trained with (export/config.json's
    `tokenizer_identity`; a checkpoint of an older trainer: its export/tokenizer files). Data tokenized with another
    one (a corpus re-tokenized at the same path) is refused, naming both fingerprints; the same one resumes; a
    missing `latest` or a checkpoint with neither record is left to the checkpointer."""
    from common.vocab import identity_of
    from data_prep.tokenizer import adopt_vocab, minilm_vocab
    from pretrain.checkpoint import check_resume_tokenizer

    vocab = minilm_vocab()
    adopt_vocab(vocab, tmp_path / "tok")
    tokens = vocab.read_text(encoding="utf-8").split("\n")[:-1]
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "vocab.txt").write_text("\n".join(tokens[:1000] + tokens[1000:][::-1]) + "\n")
    adopt_vocab(tmp_path / "p" / "vocab.txt", tmp_path / "other")
    ours, other = identity_of(tmp_path / "tok"), identity_of(tmp_path / "other")
    ckpt = tmp_path / "checkpoints"
    check_resume_tokenizer(ckpt, other, "data")  # no checkpoint yet: a new run
    tag = _checkpoint(ckpt, 4)
    (ckpt / LATEST).write_text(tag)
    check_resume_tokenizer(ckpt, other, "data")  # nothing recorded: nothing to compare
    (ckpt / tag / "export" / "config.json").write_text(json.dumps({"tokenizer_identity": ours.to_dict()}))
    check_resume_tokenizer(ckpt, ours, "data")
    with pytest.raises(ResumeError, match=r"checkpoint .*global_step4 was trained with") as refused:
        check_resume_tokenizer(ckpt, other, "the tokenizer of data.corpora[0] (/corpus)")
    assert ours.short in str(refused.value) and other.short in str(refused.value)
    (ckpt / tag / "export" / "config.json").write_text("{}")  # an older trainer: its copy of the tokenizer says
    shutil.copytree(tmp_path / "tok", ckpt / tag / "export" / "tokenizer")
    with pytest.raises(ResumeError, match="the same size, but other tokens"):
        check_resume_tokenizer(ckpt, other, "data")
