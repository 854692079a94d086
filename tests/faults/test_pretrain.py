"""Fault injection for `python -m pretrain`: kill -9 at three points of a checkpoint save, a second trainer on the
same run directory, corrupt checkpoints (flipped bytes, truncated files, missing client state, bad `latest`), NaN
optimizer state on a forced resume, a full disk, a changed hidden size under --force-resume, a corpus of [UNK]s.

CI-sized: one process on the tiny config (8 steps, checkpoints at 4 and 8, ZeRO-1 fp32 on CPU). One chain of real
runs (`killed_saves`) provides the checkpoints the other cases corrupt copies of. Each case asserts the exit code,
a message naming the file or key, no traceback, and that `latest` never names a partial or bad checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from faults import flip_bytes, small_tmpfs, truncate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pretrain"))  # the pretrain tests' helpers

from pretrain_testlib import REPO, TINY, Launch, base_env, prepare_gutenberg, read_metrics, train_args, wait_for_step  # noqa: E402

from common.integrity import hash_files, list_files, verify_share, write_checksums  # noqa: E402
from pretrain.__main__ import main  # noqa: E402

pytestmark = pytest.mark.slow
COMMON = [
    "train.train_steps=8",
    "checkpoint.interval=4",
    "checkpoint.keep_last=2",
    "train.global_batch_size=8",
    "logging.tensorboard=false",
]
MODEL_STATES = "mp_rank_00_model_states.pt"
OPTIM_STATES = "zero_pp_rank_0_mp_rank_00_optim_states.pt"

# Runs the trainer with a SIGKILL at one point of the save of global_step{N} (wrapping the functions the trainer
# calls there), optionally pausing after a step until a file appears. Test machinery only: nothing in pretrain/.
BOOTSTRAP = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    point, kill_tag, pause_at, go = sys.argv[1], f"global_step{sys.argv[2]}", int(sys.argv[3]), sys.argv[4]
    args = sys.argv[sys.argv.index("--") + 1:]
    from deepspeed.runtime.engine import DeepSpeedEngine
    import pretrain.checkpointer as C
    import pretrain.metrics as T

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "after_deepspeed_files":
        save = DeepSpeedEngine.save_checkpoint
        def save_checkpoint(self, save_dir, tag=None, **kw):
            out = save(self, save_dir, tag=tag, **kw)
            if tag == kill_tag:
                die()
            return out
        DeepSpeedEngine.save_checkpoint = save_checkpoint
    elif point == "before_checksums":
        write_checksums = C.write_checksums
        def checksums(tag_dir, entries):
            if Path(tag_dir).name == kill_tag:
                die()
            return write_checksums(tag_dir, entries)
        C.write_checksums = checksums
    elif point == "before_latest":
        commit_latest = C.commit_latest
        def latest(ckpt_dir, tag):
            if tag == kill_tag:
                die()
            return commit_latest(ckpt_dir, tag)
        C.commit_latest = latest
    if pause_at:
        log_step = T.MetricsLogger.step
        def step(self, record):
            log_step(self, record)
            while record["step"] == pause_at and not os.path.exists(go):
                time.sleep(0.05)
        T.MetricsLogger.step = step
    from pretrain.__main__ import main
    sys.exit(main(args))
    """
)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepare_gutenberg(tmp_path_factory.mktemp("faults_data") / "gutenberg")


@pytest.fixture
def in_process(monkeypatch):
    """`main([...])` in this process: it exports RANK/WORLD_SIZE/MASTER_*; put the environment back."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def _launch(work, args, log_name, point="none", pause_at=0):
    script = work / "bootstrap.py"
    script.write_text(BOOTSTRAP)
    cmd = [sys.executable, str(script), point, "8", str(pause_at), str(work / "go"), "--", *args]
    with open(work / log_name, "ab") as f:
        p = subprocess.Popen(cmd, cwd=REPO, env=base_env(), stdout=f, stderr=subprocess.STDOUT)
    return Launch([p], work / log_name, len(read_metrics(Path(args[args.index("--output") + 1]))))


def _latest(run):
    return (run / "checkpoints" / "latest").read_text()


def _events(run, name):
    return [e for line in (run / "events.jsonl").read_text().splitlines() if (e := json.loads(line))["event"] == name]


@pytest.fixture(scope="module")
def killed_saves(data, tmp_path_factory):
    """Attempt 1 trains from scratch, pauses at step 6 while a second trainer tries the same directory, then is
    killed after DeepSpeed wrote global_step8's files; attempts 2 and 3 resume from global_step4 and are killed
    before checksums.json / before `latest` of global_step8; attempt 4 resumes once more and finishes."""
    work = tmp_path_factory.mktemp("killed")
    run = work / "run"
    args = train_args(TINY, run, data, COMMON)
    first = _launch(work, args, "attempt1.log", "after_deepspeed_files", pause_at=6)
    wait_for_step(run, 6, first)
    second_trainer = subprocess.run(
        [sys.executable, "-m", "pretrain", *args], cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=300
    )
    (work / "go").touch()
    codes = first.wait(timeout=300)
    after = {"after_deepspeed_files": (codes[0], _latest(run), sorted(os.listdir(run / "checkpoints/global_step8")))}
    for point in ("before_checksums", "before_latest"):
        launch = _launch(work, args, f"{point}.log", point)
        code = launch.wait(timeout=300)[0]
        after[point] = (code, _latest(run), sorted(os.listdir(run / "checkpoints/global_step8")))
    last = _launch(work, args, "attempt4.log")
    assert last.wait(timeout=300) == [0], last.output()
    return {"run": run, "first_pid": first.procs[0].pid, "second_trainer": second_trainer, "after": after}


def test_kill_9_at_three_points_of_a_save_resumes_from_the_last_committed_checkpoint(killed_saves):
    run, after = killed_saves["run"], killed_saves["after"]
    ds_files = [MODEL_STATES, OPTIM_STATES]
    # each kill left global_step8 partial and `latest` on global_step4
    assert after["after_deepspeed_files"] == (-9, "global_step4", ds_files)
    assert after["before_checksums"] == (-9, "global_step4", sorted(["client_state.json", "export", *ds_files]))
    assert after["before_latest"] == (
        -9,
        "global_step4",
        sorted(["checksums.json", "client_state.json", "export", *ds_files]),
    )
    assert [s["resumed_from"] for s in _events(run, "start")] == [None, "global_step4", "global_step4", "global_step4"]
    # every resume recomputed steps 5-8 exactly as the uninterrupted first attempt had
    by_attempt = {}
    for r in read_metrics(run):
        by_attempt.setdefault(r["attempt"], {})[r["step"]] = r
    assert sorted(by_attempt) == [1, 2, 3, 4] and sorted(by_attempt[1]) == list(range(1, 9))
    for attempt in (2, 3, 4):
        assert sorted(by_attempt[attempt]) == [5, 6, 7, 8]
        for step in (5, 6, 7, 8):
            a, b = by_attempt[1][step], by_attempt[attempt][step]
            assert (b["loss"], b["mlm_loss"], b["samples_digest"]) == (a["loss"], a["mlm_loss"], a["samples_digest"])
    assert _latest(run) == "global_step8"
    for tag in ("global_step4", "global_step8"):
        assert verify_share(run / "checkpoints" / tag, 0, 1) == []


def test_a_second_trainer_on_the_same_run_directory_is_refused(killed_saves):
    """While attempt 1 held the directory a second trainer stopped at once, naming the holder; it wrote nothing (no
    start event, no metrics). Attempt 2 started right after attempt 1's SIGKILL: the lock was not stuck."""
    r = killed_saves["second_trainer"]
    assert r.returncode == 2 and "Traceback" not in r.stderr
    holder = f"is being written by another process: pid {killed_saves['first_pid']} on host {socket.gethostname()}"
    assert holder in r.stderr and f"{killed_saves['run'].parent / '.run.claim' / '0'}" in r.stderr
    assert len(_events(killed_saves["run"], "start")) == 4  # the four attempts, not the refused trainer


@pytest.fixture
def run_copy(killed_saves, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(killed_saves["run"], dst)
    return dst


def _main(args, capsys):
    code = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def test_flipped_bytes_in_the_zero_optimizer_state_are_refused_by_checksum(run_copy, data, capsys, in_process):
    optim = run_copy / "checkpoints/global_step8" / OPTIM_STATES
    flip_bytes(optim)
    config_before = (run_copy / "config.yaml").read_text()
    code, err = _main(train_args(TINY, run_copy, data, COMMON), capsys)
    assert code == 2 and f"{optim}: contents differ from the sha256 in checksums.json" in err
    assert "Older committed checkpoints: global_step4" in err and "--no-verify-checksums" in err
    assert _latest(run_copy) == "global_step8" and (run_copy / "config.yaml").read_text() == config_before
    code, err = _main(
        ["export", "--checkpoint", str(run_copy / "checkpoints"), "--output", str(run_copy / "hf")], capsys
    )
    assert code == 2 and "refusing to export checkpoint" in err and OPTIM_STATES in err
    assert not (run_copy / "hf").exists()


def test_a_truncated_model_states_file_is_named_on_resume_and_export(run_copy, data, capsys, in_process):
    states = run_copy / "checkpoints/global_step8" / MODEL_STATES
    truncate(states, 0.5)
    args = train_args(TINY, run_copy, data, COMMON)
    code, err = _main(args, capsys)
    assert code == 2 and f"{states}: " in err and "(truncated: an interrupted write or a full disk?)" in err
    code, err = _main([*args, "--no-verify-checksums"], capsys)  # checksums skipped: the structure still fails
    assert code == 2 and f"{states}: not a complete PyTorch file" in err
    export = ["export", "--checkpoint", str(run_copy / "checkpoints"), "--output", str(run_copy / "hf")]
    code, err = _main([*export, "--no-verify-checksums"], capsys)
    assert code == 2 and f"{states}: not a complete PyTorch file" in err and not (run_copy / "hf").exists()


def test_missing_client_state_and_a_garbled_latest_are_clear_errors(run_copy, data, capsys, in_process):
    args = train_args(TINY, run_copy, data, COMMON)
    (run_copy / "checkpoints/global_step8/client_state.json").unlink()
    code, err = _main(args, capsys)
    assert code == 2 and "global_step8/client_state.json is missing" in err
    assert "Older committed checkpoints: global_step4" in err
    (run_copy / "checkpoints/latest").write_bytes(b"\xff\xfe\x00garbage")
    code, err = _main(args, capsys)
    assert code == 2 and f"{run_copy / 'checkpoints/latest'} is unreadable" in err


def test_export_refuses_non_finite_weights(run_copy, capsys, in_process):
    """A checkpoint that holds NaN weights with valid checksums (as the old trainer could save one) is refused."""
    tag_dir = run_copy / "checkpoints/global_step8"
    state = torch.load(tag_dir / OPTIM_STATES, weights_only=False)  # our own test checkpoint
    state["optimizer_state_dict"]["single_partition_of_fp32_groups"][0].data[:4] = float("nan")
    torch.save(state, tag_dir / OPTIM_STATES)
    write_checksums(tag_dir, hash_files(tag_dir, list_files(tag_dir)))
    code, err = _main(
        ["export", "--checkpoint", str(run_copy / "checkpoints"), "--output", str(run_copy / "hf")], capsys
    )
    assert code == 2 and "weight tensor(s) hold NaN/inf" in err and "--tag global_stepN" in err
    assert not (run_copy / "hf").exists()


def _rewind_to_step4(run):
    shutil.rmtree(run / "checkpoints/global_step8")
    (run / "checkpoints/latest").write_text("global_step4")


@pytest.mark.parametrize(
    ("poison", "message"),
    [
        # NaN Adam moments: step 5's loss is finite, its update turns the weights NaN; the save after it refuses
        (OPTIM_STATES, "1 weight tensor(s) hold NaN/inf at step 5"),
        # NaN module weights: the first resumed forward is already NaN
        (MODEL_STATES, "non-finite loss (nan) at step 5"),
    ],
    ids=["nan_adam_moments", "nan_module_weights"],
)
def test_a_forced_resume_onto_nan_state_stops_without_saving(run_copy, data, poison, message):
    """NaN in a checkpoint's state (what flipped bytes can make), resumed with --no-verify-checksums and a save due
    after every step: the trainer stops at step 5 with exit 3; `latest` stays on global_step4, no step-5 save."""
    _rewind_to_step4(run_copy)
    path = run_copy / "checkpoints/global_step4" / poison
    state = torch.load(path, weights_only=False)  # our own test checkpoint
    if poison == OPTIM_STATES:
        state["optimizer_state_dict"]["base_optimizer_state"]["state"][0]["exp_avg_sq"].data[:16] = float("nan")
    else:
        state["module"]["elasticbert.embeddings.LayerNorm.weight"].data[:16] = float("nan")  # every token passes it
    torch.save(state, path)
    args = train_args(TINY, run_copy, data, [*COMMON, "checkpoint.interval=1"]) + ["--no-verify-checksums"]
    r = subprocess.run([sys.executable, "-m", "pretrain", *args], cwd=REPO, env=base_env(), capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-2000:]
    assert message in r.stderr and "stays on global_step4" in r.stderr and "Traceback" not in r.stderr
    assert _latest(run_copy) == "global_step4" and not (run_copy / "checkpoints/global_step5").exists()
    assert _events(run_copy, "diverged")[-1]["step"] == 5


def test_a_full_disk_during_a_save_leaves_latest_on_the_last_committed_checkpoint(killed_saves, data, tmp_path):
    """The run directory on a tmpfs with room for less than one more checkpoint: the save of global_step8 fails,
    the trainer exits 4 naming the error, the partial directory is removed, `latest` stays on global_step4."""
    checkpoint_bytes = sum(p.stat().st_size for p in (killed_saves["run"] / "checkpoints/global_step8").rglob("*"))
    staged = tmp_path / "staged"
    shutil.copytree(killed_saves["run"], staged)
    _rewind_to_step4(staged)
    used = sum(p.stat().st_size for p in staged.rglob("*") if p.is_file())
    size_mb = (used + checkpoint_bytes // 2) // 2**20 + 1
    with small_tmpfs(tmp_path / "disk", f"{size_mb}m") as disk:
        run = disk / "run"
        shutil.copytree(staged, run)
        r = subprocess.run([sys.executable, "-m", "pretrain", *train_args(TINY, run, data, COMMON)], cwd=REPO,
                           env=base_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
        assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]
        assert f"checkpoint {run / 'checkpoints/global_step8'} could not be written" in r.stderr
        assert "stays on global_step4" in r.stderr and "Traceback" not in r.stderr
        assert _latest(run) == "global_step4" and not (run / "checkpoints/global_step8").exists()
        assert verify_share(run / "checkpoints/global_step4", 0, 1) == []


def test_a_changed_hidden_size_is_refused_even_with_force_resume(run_copy, data, capsys, in_process):
    args = train_args(TINY, run_copy, data, [*COMMON, "model.hidden_size=128"]) + ["--force-resume"]
    code, err = _main(args, capsys)
    assert code == 2 and "checkpoint global_step8 has weights of another shape: model.hidden_size: 64 -> 128" in err
    assert "--force-resume cannot load them; restore model.hidden_size" in err


def test_a_corpus_of_unk_tokens_is_refused_by_build_index_and_train(data, tmp_path, capsys, in_process):
    from pretrain.config import load_config
    from pretrain.corpora import open_data

    corpus = tmp_path / "unk_corpus"
    shutil.copytree(data, corpus, ignore=shutil.ignore_patterns("index_cache"))
    manifest = json.loads((corpus / "manifest.json").read_text())
    assert manifest["totals"]["unk_tokens"] == 0  # data_prep records it; the real books have no [UNK]
    manifest["totals"]["unk_tokens"] = manifest["totals"]["tokens"] // 2
    (corpus / "manifest.json").write_text(json.dumps(manifest))
    sets = [f"data.corpora.0.path={corpus}"]
    code, err = _main(["build-index", "--config", str(TINY), "--output", str(tmp_path / "r"), "--set", sets[0]], capsys)
    assert code == 2 and f"data.corpora[0] ({corpus / 'manifest.json'}): 50 % [UNK]" in err
    assert "above data.max_unk_fraction=0.01" in err
    code, err = _main(train_args(TINY, tmp_path / "run", corpus, []), capsys)
    assert code == 2 and "50 % [UNK]" in err and not (tmp_path / "run" / "config.yaml").exists()
    accepted = load_config(TINY, [*sets, "data.max_unk_fraction=1.0", "data.verify=false"])
    assert len(open_data(accepted, tmp_path, need_valid=False).train[0]) > 0  # the override lets it through
    del manifest["totals"]["unk_tokens"]
    (corpus / "manifest.json").write_text(json.dumps(manifest))
    bundle = open_data(load_config(TINY, [*sets, "data.verify=false"]), tmp_path, need_valid=False)
    assert any("records no totals.unk_tokens" in n for n in bundle.notes)  # an old manifest: said, not silent


def test_workers_stop_within_seconds_when_their_launcher_is_killed(data, tmp_path):
    """kill -9 of the torchrun launcher alone used to leave its workers training to the end, unsupervised; now the
    kernel sends each worker SIGTERM (PR_SET_PDEATHSIG), which the trainer takes as a preemption: every rank saves
    at the next step boundary and exits."""
    import signal
    import time

    import psutil
    from pretrain_testlib import launch_torchrun

    run = tmp_path / "run"
    args = train_args(TINY, run, data, ["train.train_steps=400", "checkpoint.interval=1000"])
    launch = launch_torchrun(args, 2, tmp_path / "log.txt")
    try:
        wait_for_step(run, 2, launch)
        launcher = psutil.Process(launch.procs[0].pid)
        workers = [p for p in launcher.children(recursive=True) if "pretrain" in " ".join(p.cmdline())]
        assert len(workers) == 2, [p.cmdline() for p in workers]
        launcher.send_signal(signal.SIGKILL)
        start = time.time()
        gone, alive = psutil.wait_procs(workers, timeout=60)
        assert not alive, f"workers still running 60 s after their launcher died:\n{launch.output()}"
        assert time.time() - start < 60
    finally:
        launch.kill()
    stopped = read_metrics(run)[-1]["step"]
    assert stopped < 400, "the workers trained to the end"
    assert (run / "checkpoints" / "latest").read_text().strip() == f"global_step{stopped}"  # saved where it stopped
