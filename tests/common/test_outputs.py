"""`common.outputs.check_output`, the one rule of every `--output` (issue 47), on folders and files built here, with
the claims it takes inside a command (`common.claims`, issue 59: one writer per output, its ranks sharing it, a dead
holder's claim taken over) and paths compared by identity (a bind mount, a symbolic link, `..`); and numpy's
errno-less short write read as the OSError it stands for."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from faults import bind_mount, small_tmpfs
from requirements import REPO

from common import claims
from common.claims import ClaimError, Part
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
from common.run_dir import RUN_FILES, prepare_run_dir

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


# ------------------------------------------------------------------------------------------------ claims (issue 59)
HOLDER = """
import sys, time
from common import claims
from common.claims import Part
out, slot, job, go = sys.argv[1], int(sys.argv[2]), sys.argv[3] or None, sys.argv[4]
while go != "-" and not __import__("os").path.exists(go):
    time.sleep(0.001)
with claims.command("holder", "holder --output " + out):
    try:
        claims.take(out, Part(slot, job))
    except claims.ClaimError as err:
        print("refused", err.holder, flush=True)
        sys.exit(2)
    print("held", flush=True)
    sys.stdin.readline()
"""


def holder(out, slot: int = 0, job: str = "", go: str = "-") -> subprocess.Popen:
    """A process that claims `out` (as `slot` of `job`) and holds it until its stdin is closed."""
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out), str(slot), job, go],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def in_command(func, *args):
    with claims.command("test", "test --output x"):
        return func(*args)


def test_processes_racing_for_one_output_leave_one_writer_and_name_it(tmp_path):
    """Six processes claim one output at the same instant, three times: exactly one wins each time, and every other
    one is refused naming the winner's pid and host. Afterwards the claim is gone with its holder."""
    out = tmp_path / "conc.jsonl"
    for round_ in range(3):
        go = tmp_path / f"go{round_}"
        procs = [holder(out, go=str(go)) for _ in range(6)]
        time.sleep(0.3)
        go.touch()
        answers = [p.stdout.readline().split() for p in procs]
        winners = [p for p, answer in zip(procs, answers) if answer == ["held"]]
        assert len(winners) == 1, answers
        assert all(a[:4] == ["refused", "pid", str(winners[0].pid), "on"] for a in answers if a != ["held"]), answers
        for p in procs:
            p.communicate("")
        assert [p.returncode for p in procs].count(0) == 1
        assert not (tmp_path / ".conc.jsonl.claim").exists()  # the last part out removed the folder


def test_the_parts_of_one_job_share_an_output_and_no_one_else_does(tmp_path):
    """Rank 0 of a job holds the run directory: its rank 1 shares it; rank 1 of another job, and a process alone, are
    refused naming rank 0; a forked child holds nothing."""
    run = tmp_path / "run"
    rank0 = holder(run, 0, "job A")
    try:
        assert rank0.stdout.readline().strip() == "held"
        in_command(claims.take, run, Part(1, "job A"))
        with pytest.raises(ClaimError) as other_job:
            in_command(claims.take, run, Part(1, "job B"))
        assert f"pid {rank0.pid} on host {socket.gethostname()} (holder --output {run}" in str(other_job.value)
        assert f"{tmp_path / '.run.claim' / '0'}" in str(other_job.value) and "rank 0" in str(other_job.value)
        with pytest.raises(ClaimError):
            in_command(claims.take, run, Part())
    finally:
        rank0.communicate("")


def test_the_ranks_of_a_job_starting_at_once_on_a_slow_file_system_all_share_the_output(tmp_path):
    """Four ranks of one job claim their run directory at the same instant, each slowed (a loaded node, a shared
    file system) between locking its file and reading the others' for longer than a held file may stay without
    its record: all four share it. (Before the fix each wrote its record after that read, and all refused one
    another as "a process that has not written its name yet": a 16-rank Slurm job, seen on a loaded box.)"""
    run, go = tmp_path / "run", tmp_path / "go"
    slow = (
        "_check = claims._check_other_parts\n"
        "claims._check_other_parts = lambda *a: (time.sleep(claims.RECORD_WAIT_S + 0.5), _check(*a))[1]\n"
    )
    code = HOLDER.replace("with claims.command(", slow + "with claims.command(", 1)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(run), str(rank), "job A", str(go)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(4)
    ]
    try:
        time.sleep(0.3)
        go.touch()
        assert [p.stdout.readline().strip() for p in procs] == ["held"] * 4
        records = [json.loads((tmp_path / ".run.claim" / str(rank)).read_text()) for rank in range(4)]
        assert [(r["slot"], r["job"]) for r in records] == [(rank, "job A") for rank in range(4)]
    finally:
        for p in procs:
            p.communicate("")
    assert not (tmp_path / ".run.claim").exists()


def test_a_dead_holders_claim_is_taken_over_and_said(tmp_path, capsys):
    """SIGKILL leaves the claim's file behind but not its lock: the next command takes it over with a note naming the
    dead holder; a forked child of a holder does not keep the claim alive."""
    out = tmp_path / "sub" / "p.jsonl"
    # the child says so after its fork hooks ran; each line in one write (the two share the pipe)
    forking = 'os = __import__("os")\n    os.write(1, b"held\\n" if os.fork() else b"forked\\n")'
    code = HOLDER.replace('print("held", flush=True)', forking)
    killed = subprocess.Popen(
        [sys.executable, "-c", code, str(out), "0", "", "-"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert {killed.stdout.readline().strip(), killed.stdout.readline().strip()} == {"held", "forked"}
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    assert json.loads((tmp_path / "sub" / ".p.jsonl.claim" / "0").read_text())["pid"] == killed.pid
    capsys.readouterr()
    with claims.command("finetune", "finetune predict"):
        claims.take(out)
        note = capsys.readouterr().err
        assert f"finetune: note: --output {out}: taking over the claim of pid {killed.pid} on host" in note
        assert "which ended without giving it back" in note
    assert not (tmp_path / "sub" / ".p.jsonl.claim").exists()
    killed.stdin.close()


def test_without_flock_a_claim_is_an_exclusive_create(tmp_path, monkeypatch, capsys):
    """A file system without flock (Lustre without `-o flock`): the part's file is created exclusively; a dead
    holder of this host is told by its pid and taken over, one of another host is refused with the file to remove."""

    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(claims, "fcntl", type("NoFlock", (), {"flock": staticmethod(no_flock), **LOCKS})())
    out, part = tmp_path / "p.jsonl", tmp_path / ".p.jsonl.claim" / "0"
    part.parent.mkdir()
    part.write_text(json.dumps({"pid": 2**22 + 7, "host": "gpu12", "command": "x", "started": "t"}))
    with pytest.raises(ClaimError) as elsewhere:
        in_command(claims.take, out)
    assert "pid 4194311 on host gpu12" in str(elsewhere.value) and f"if that process is gone, remove {part}" in str(
        elsewhere.value
    )
    here = {"host": socket.gethostname(), "command": "x", "started": "t"}
    part.write_text(json.dumps({"pid": os.getppid(), **here}))  # a live process of this host
    with pytest.raises(ClaimError):
        in_command(claims.take, out)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    part.write_text(json.dumps({"pid": int(dead.stdout), **here}))
    with claims.command("test", "test"):
        claims.take(out)
        assert json.loads(part.read_text())["pid"] == os.getpid()
        assert f"taking over the claim of pid {int(dead.stdout)}" in capsys.readouterr().err
    assert not part.parent.exists()


LOCKS = {name: getattr(__import__("fcntl"), name) for name in ("LOCK_EX", "LOCK_SH", "LOCK_NB")}


def test_check_output_claims_inside_a_command_before_it_looks(tmp_path):
    """Inside a command the output is claimed, then checked: a refused check gives the claim back, and the command's
    end gives back the rest; the folders made for the claim go with it."""
    out = tmp_path / "new" / "deeper" / "p.jsonl"
    with claims.command("test", "test"):
        check_output(out, FILE)
        assert (tmp_path / "new" / "deeper" / ".p.jsonl.claim" / "0").is_file()
        taken = holder(out)
        assert taken.stdout.readline().split()[:2] == ["refused", "pid"]
        taken.communicate("")
    assert not (tmp_path / "new").exists()  # made for the claim, empty again
    (tmp_path / "mine.jsonl").write_text('{"label": "1"}\n')
    with claims.command("test", "test"):
        with pytest.raises(OutputError):
            check_output(tmp_path / "mine.jsonl", FILE)
        assert not (tmp_path / ".mine.jsonl.claim").exists()
    check_output(tmp_path / "outside.jsonl", FILE)  # a library call outside a command claims nothing
    assert not (tmp_path / ".outside.jsonl.claim").exists()


def test_a_run_directory_never_takes_over_a_file_no_run_wrote(tmp_path):
    """A run directory lists the names its runs write (RUN/.run_files.json, written when the run starts): a user's own
    file of one of those names is refused, a file the list has (the run's own, resumed) is not, and a run directory
    of the command's kind written before such lists were kept counts as its own."""
    spec = Output("pretrain", "a run directory", folder=True, exclusive=True, writes=("events.jsonl", "ckpt*"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "events.jsonl").write_text('{"mine": 1}\n')
    (run / "notes.txt").write_text("a file of no run's name is left alone")
    line = refused(run, spec)
    assert f"--output {run} holds events.jsonl, which no run of pretrain wrote there" in line
    assert "never appends to or replaces a file it did not create" in line
    fresh = tmp_path / "fresh"
    with claims.command("pretrain", "pretrain train"):
        check_output(fresh, spec)
        prepare_run_dir(fresh)
    assert json.loads((fresh / RUN_FILES).read_text())["files"] == ["ckpt*", "events.jsonl"]
    (fresh / "events.jsonl").write_text("{}\n")
    (fresh / "ckpt1").mkdir()
    assert check_output(fresh, spec) == fresh  # its own files, resumed
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "events.jsonl").write_text("{}\n")
    (legacy / "metrics.jsonl").write_text("{}\n")  # a pre-training run of an earlier version
    own_kind = Output(
        "pretrain",
        "a run directory",
        folder=True,
        exclusive=True,
        accepts=("a pre-training run",),
        writes=("events.jsonl",),
    )
    assert check_output(legacy, own_kind) == legacy


def test_paths_are_compared_by_what_they_are(tmp_path):
    """One folder at two paths (a bind mount), a symbolic link and `..`: an input inside the output, or the output
    inside an input, is found whichever way each is spelled (issue 59: a bind mount let `finetune train --overwrite`
    delete its own --model)."""
    data = tmp_path / "data"
    model = model_dir(data / "run" / "best")
    (data / "run" / "run_config.json").write_text("{}")
    with bind_mount(data, tmp_path / "alias") as alias:
        assert "holds the input --model" in refused(data / "run", RUN, [("--model", alias / "run" / "best")])
        assert "is inside the input --model" in refused(alias / "run" / "best" / "x", RUN, [("--model", model)])
        assert "is the input --model" in refused(alias / "run" / "best", EXPORT, [("--model", model)], overwrite=True)
        dots = alias / "run" / ".." / "run" / "best"
        assert "holds the input --model" in refused(data / "run", RUN, [("--model", dots)])
        with claims.command("test", "test"):  # and one claim for both spellings of one output
            claims.take(data / "out.jsonl")
            with pytest.raises(ClaimError):
                claims.take(alias / "out.jsonl", Part(0, "another process's"))
