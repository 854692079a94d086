"""Real DeepSpeed training on CPU (gloo, fp32), 1-2 processes, tiny model, prepared Gutenberg shards.

One reference run per ZeRO stage (30 steps, checkpoints every 5); the resume, world-size and export tests compare
against them. Launchers: torchrun, srun-style SLURM_* variables, and a single torchrun process.
"""

from __future__ import annotations

import json
import shutil
import signal

import numpy as np
import pytest
import torch
from pretrain_testlib import (
    TINY,
    launch_deepspeed,
    launch_srun_style,
    launch_torchrun,
    read_metrics,
    train_args,
    wait_for_step,
)

from data_prep.reader import PreparedCorpus
from pretrain.config import load_config
from pretrain.data import SampleOrder, index_key
from pretrain.metrics import latest_per_step

pytestmark = pytest.mark.slow
STEPS = 30
GROUPS = [(1, 3, 4), (2, 4)]
COMMON = [f"train.train_steps={STEPS}", "checkpoint.interval=5", "checkpoint.keep_last=3"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


def _train(work, data, name, overrides, nproc=2):
    run = work / name
    launch = launch_torchrun(train_args(TINY, run, data, COMMON + overrides), nproc, work / f"{name}.log")
    codes = launch.wait(timeout=420)
    assert codes == [0], f"{name} failed:\n{launch.output()}"
    return run


@pytest.fixture(scope="module")
def zero_runs(work, prepared_gutenberg):
    """ZeRO-1/2/3 reference runs. ZeRO-1 also logs per-rank sample ids and validates; all dump their gathered
    in-memory weights at the end so exports can be compared with them."""
    runs = {}
    for stage in (1, 2, 3):
        extra = [f"train.zero_stage={stage}", "checkpoint.dump_final_weights=true"]
        if stage == 1:
            extra += ["logging.log_samples=true", "eval.interval=15", "eval.max_samples=64"]
        runs[stage] = _train(work, prepared_gutenberg, f"zero{stage}", extra)
    return runs


def events(run):
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_each_zero_stage_trains_the_right_groups_and_learns(zero_runs, stage):
    run = zero_runs[stage]
    recs = latest_per_step(read_metrics(run))
    assert sorted(recs) == list(range(1, STEPS + 1))
    start = events(run)[0]
    assert (start["zero_stage"], start["world_size"], start["micro_batch"], start["grad_accum"]) == (stage, 2, 4, 2)
    for step, r in recs.items():
        assert tuple(r["active_exits"]) == GROUPS[(step - 1) % 2], f"step {step} trained {r['active_exits']}"
        assert len(r["mlm_loss"]) == len(r["active_exits"]) == len(r["sop_accuracy"])
        assert r["consumed_samples"] == 16 * step
        assert np.isfinite(r["loss"]) and r["grad_norm"] > 0
    for g in (0, 1):  # loss of the same group (same exits) falls on real text
        losses = [recs[s]["loss"] for s in sorted(recs) if (s - 1) % 2 == g]
        assert np.mean(losses[-3:]) < 0.93 * np.mean(losses[:3]), f"group {g}: {losses}"
    top = [recs[s]["mlm_loss"][-1] for s in sorted(recs)]  # layer 4 is in every group
    assert np.mean(top[-5:]) < np.mean(top[:5]) - 0.5
    # lr: warmup then decay, as logged
    lrs = [recs[s]["lr"] for s in sorted(recs)]
    assert lrs[0] < lrs[2] and lrs[2] == max(lrs) and lrs[-1] < lrs[10]
    assert (run / "checkpoints" / "latest").read_text() == f"global_step{STEPS}"
    kept = sorted(p.name for p in (run / "checkpoints").glob("global_step*"))
    assert kept == ["global_step20", "global_step25", "global_step30"]  # keep_last=3
    # checksums.json written from both ranks' shares lists every file, DeepSpeed's per-rank files included
    from common.integrity import list_files, verify_share

    for tag in kept:
        recorded = json.loads((run / "checkpoints" / tag / "checksums.json").read_text())["files"]
        assert sorted(recorded) == list_files(run / "checkpoints" / tag)
        assert sum(name.endswith("_optim_states.pt") for name in recorded) == 2  # one per rank
        assert verify_share(run / "checkpoints" / tag, 0, 1) == []
    assert start["precision"] == "fp32" and start["precision_reason"].startswith("auto: CPU")


def test_tensorboard_and_validation(zero_runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = zero_runs[1]
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in (
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/tokens_per_s",
        "train/mfu",
        "train/data_wait_s",
        "mlm_loss/exit_01",
        "mlm_loss/exit_02",
        "sop_accuracy/exit_04",
        "valid_mlm_loss/exit_03",
    ):
        assert tag in tags, tag
    assert len(acc.Scalars("mlm_loss/exit_01")) == STEPS // 2  # exit 1 trains only in group 0
    evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [15, 30]
    for e in evals:
        assert e["exits"] == [1, 2, 3, 4] and e["samples"] == 64
        assert all(0 <= a <= 1 for a in e["sop_accuracy"] + e["mlm_accuracy"])
    assert np.mean(evals[1]["mlm_loss"]) < np.mean(evals[0]["mlm_loss"])


def test_ranks_read_disjoint_samples_in_the_predicted_order(zero_runs, prepared_gutenberg):
    run = zero_runs[1]
    per_rank = {}
    for r in (0, 1):
        rows = [json.loads(line) for line in (run / f"samples_rank{r}.jsonl").read_text().splitlines()]
        per_rank[r] = {(row["step"], row["micro"]): [tuple(k) for k in row["keys"]] for row in rows}
    all_keys = [k for r in (0, 1) for v in per_rank[r].values() for k in v]
    assert len(all_keys) == 16 * STEPS
    assert len(set(all_keys)) == len(all_keys), "a sample was read twice (within one epoch)"
    # exactly what the order predicts for each rank's slice of each global batch
    # this run's index by its key: other tests of the module share the cache with other lengths
    cfg = load_config(TINY)
    key = index_key(
        PreparedCorpus(prepared_gutenberg), "train", cfg.data.max_length, cfg.data.short_seq_prob, cfg.train.seed
    )
    index_size = len(np.load(prepared_gutenberg / "index_cache" / f"sample_index_train_{key}.npy"))
    order = SampleOrder([index_size], [1.0], cfg.train.seed)
    for step in range(STEPS):
        predicted = order(np.arange(step * 16, step * 16 + 16))[1].tolist()
        got = [i for r in (0, 1) for m in (0, 1) for _, i in per_rank[r][(step, m)]]
        assert got == predicted


def _assert_same_losses(a, b, after, tol):
    worst = 0.0
    for step in range(after + 1, STEPS + 1):
        ra, rb = a[step], b[step]
        assert ra["active_exits"] == rb["active_exits"] and ra["consumed_samples"] == rb["consumed_samples"]
        assert ra["samples_digest"] == rb["samples_digest"], f"step {step}: different samples"
        diffs = [abs(ra["loss"] - rb["loss"])] + [abs(x - y) for x, y in zip(ra["mlm_loss"], rb["mlm_loss"])]
        worst = max(worst, *diffs)
        assert max(diffs) <= tol, f"step {step}: loss {rb['loss']} vs {ra['loss']}"
    return worst


@pytest.fixture(scope="module")
def interrupted_run(work, zero_runs, prepared_gutenberg):
    """Run B (same config as the ZeRO-1 reference): SIGKILL after step 12 -> restart under srun-style variables ->
    SIGTERM after step 17 (agreed save, exit 75) -> copy for the world-size test -> restart to the end."""
    run = work / "B"
    args = train_args(TINY, run, prepared_gutenberg, COMMON + ["train.zero_stage=1"])
    log = work / "B.log"
    first = launch_torchrun(args, 2, log)
    wait_for_step(run, 12, first)
    first.kill(signal.SIGKILL)  # the launcher and both workers, like a node failure
    first.wait()
    killed_resume = int((run / "checkpoints" / "latest").read_text().removeprefix("global_step"))

    second = launch_srun_style(args, 2, log)
    wait_for_step(run, killed_resume + 7, second)
    second.signal_each(signal.SIGTERM)  # Slurm signals every task
    codes = second.wait()
    assert codes == [75, 75], second.output()
    term_resume = int((run / "checkpoints" / "latest").read_text().removeprefix("global_step"))
    snapshot = work / "B_at_sigterm"
    shutil.copytree(run, snapshot)

    third = launch_torchrun(args, 2, log)
    assert third.wait() == [0], third.output()
    return {"run": run, "killed_resume": killed_resume, "term_resume": term_resume, "snapshot": snapshot}


def test_exact_resume_after_sigkill_and_after_sigterm(zero_runs, interrupted_run):
    ref = latest_per_step(read_metrics(zero_runs[1]))
    b = interrupted_run
    ev = events(b["run"])
    starts = [e for e in ev if e["event"] == "start"]
    assert [s["resumed_from"] for s in starts] == [
        None,
        f"global_step{b['killed_resume']}",
        f"global_step{b['term_resume']}",
    ]
    assert starts[1]["launcher"] == "srun" and starts[2]["launcher"] == "torchrun"
    preempted = [e for e in ev if e["event"] == "preempted"]
    assert len(preempted) == 1 and preempted[0]["step"] == b["term_resume"] and preempted[0]["signal"] == "SIGTERM"
    assert b["killed_resume"] >= 10 and b["term_resume"] > b["killed_resume"]
    records = read_metrics(b["run"])
    # the killed attempt logged steps past its last checkpoint; the restart recomputed them identically
    attempt1 = {r["step"]: r for r in records if r["attempt"] == 1}
    attempt2 = {r["step"]: r for r in records if r["attempt"] == 2}
    redone = sorted(set(attempt1) & set(attempt2))
    assert redone, "the SIGKILL should have lost at least one step"
    for s in redone:
        assert abs(attempt1[s]["loss"] - attempt2[s]["loss"]) <= 1e-6
    worst = _assert_same_losses(ref, latest_per_step(records), b["killed_resume"], tol=1e-6)
    print(f"max |loss difference| vs uninterrupted run after resumes: {worst:.3g}")


def test_resume_with_fewer_processes(work, zero_runs, interrupted_run, prepared_gutenberg):
    """2 -> 1 process: universal checkpoint, same consumed_samples, same sample order, same exit groups; losses
    equal up to floating-point reduction order (micro-batch size kept, so micro-batches and dropout seeds match)."""
    run = interrupted_run["snapshot"]
    args = train_args(TINY, run, prepared_gutenberg, COMMON + ["train.zero_stage=1"])
    one = launch_torchrun(args, 1, work / "C.log")
    assert one.wait() == [0], one.output()
    start = [e for e in events(run) if e["event"] == "start"][-1]
    resume = interrupted_run["term_resume"]
    assert start["world_size"] == 1 and start["grad_accum"] == 4 and start["micro_batch"] == 4
    assert start["consumed_samples"] == 16 * resume and start["load_tag"] == f"global_step{resume}_universal"
    ref = latest_per_step(read_metrics(zero_runs[1]))
    worst = _assert_same_losses(ref, latest_per_step(read_metrics(run)), resume, tol=1e-4)
    print(f"max |loss difference| after a 2 -> 1 process resume: {worst:.3g}")


@pytest.mark.parametrize("stage", [3, 2, 1])
def test_export_matches_in_memory_weights(zero_runs, tmp_path, stage):
    from safetensors.torch import load_file
    from transformers import AutoModel, AutoModelForPreTraining, AutoTokenizer

    from pretrain.__main__ import main

    out = tmp_path / f"hf{stage}"
    assert main(["export", "--checkpoint", str(zero_runs[stage] / "checkpoints"), "--output", str(out)]) == 0
    in_memory = load_file(zero_runs[stage] / "final_weights.safetensors")
    exported = AutoModelForPreTraining.from_pretrained(out).state_dict()
    assert set(exported) == set(in_memory)
    for k, v in in_memory.items():
        assert torch.equal(exported[k], v), k
    assert (out / "model.safetensors").is_file() and (out / "vocab.txt").is_file()
    base = AutoModel.from_pretrained(out)
    assert type(base).__name__ == "ElasticBertModel"
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.mask_token_id == 103 and json.loads((out / "pretrain_info.json").read_text())["step"] == STEPS
    # what finetune does: a classifier with exits on top of the export; only the new classifiers are fresh
    from transformers import BertTokenizer

    from elasticbert import ElasticBertForSequenceClassification, load_pretrained

    clf, report = load_pretrained(ElasticBertForSequenceClassification, out, num_labels=3, exit_layers=[2, 4])
    assert report.initialised and all("classifier" in k for k in report.initialised), report
    assert torch.equal(
        clf.elasticbert.encoder.pooler[1].dense.weight, in_memory["elasticbert.encoder.pooler.1.dense.weight"]
    )
    assert BertTokenizer.from_pretrained(str(out))("a test")["input_ids"][0] == 101
    assert main(["export", "--checkpoint", str(zero_runs[stage] / "checkpoints"), "--output", str(out)]) == 2


def test_refuses_a_checkpoint_from_another_config(zero_runs, prepared_gutenberg, capsys, clean_env):
    from pretrain.__main__ import main

    run = zero_runs[1]
    before = (run / "config.yaml").read_text()
    args = train_args(TINY, run, prepared_gutenberg, COMMON + ["train.zero_stage=1", "optim.lr=5e-3"])
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "written under a different config" in err and "optim.lr: 0.002 -> 0.005" in err
    assert "--force-resume" in err
    assert (run / "config.yaml").read_text() == before, "a refused start must not touch the run directory"


def test_deepspeed_launcher_reproduces_the_torchrun_run(work, zero_runs, prepared_gutenberg):
    """`deepspeed --num_gpus 2 --module pretrain train ...`: same steps, same losses as under torchrun."""
    run = work / "ds_launcher"
    launch = launch_deepspeed(
        train_args(TINY, run, prepared_gutenberg, COMMON + ["train.zero_stage=1", "train.stop_after_steps=4"]),
        2,
        work / "ds.log",
    )
    assert launch.wait() == [0], launch.output()
    assert events(run)[0]["launcher"] == "deepspeed"
    ref, got = latest_per_step(read_metrics(zero_runs[1])), latest_per_step(read_metrics(run))
    assert sorted(got) == [1, 2, 3, 4]
    for step in got:
        assert got[step]["loss"] == ref[step]["loss"] and got[step]["samples_digest"] == ref[step]["samples_digest"]
    assert (run / "checkpoints" / "latest").read_text() == "global_step4"  # stop_after_steps saves before exiting


def test_every_rank_leaves_the_process_group_before_exit(work, prepared_gutenberg, tmp_path):
    """A rank that exits with gloo's process group alive can abort at interpreter exit ("terminate called without
    an active exception", pytorch#190489): CI lost a finished Slurm step to it. Both ranks must have destroyed it
    when the trainer returns."""
    import subprocess
    import sys

    from pretrain_testlib import REPO, base_env

    from common.dist import free_port

    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os, sys, torch.distributed as dist\n"
        "from pretrain.__main__ import main\n"
        "code = main(sys.argv[1:])\n"
        "from pathlib import Path\n"
        "report = Path(os.environ['PROBE_DIR']) / f'rank{os.environ[\"RANK\"]}.txt'\n"
        "report.write_text(f'rank {os.environ[\"RANK\"]} exit {code} group alive {dist.is_initialized()}')\n"
        "sys.exit(code)\n"
    )
    run = work / "leaves_group"
    args = train_args(TINY, run, prepared_gutenberg, ["train.train_steps=4", "optim.warmup_steps=1"])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
    cmd += ["--master_port", str(free_port()), str(probe), *args]
    # One file per rank: the two ranks share torchrun's stdout, where their lines can interleave (CI saw it).
    env = {**base_env(), "PROBE_DIR": str(tmp_path)}
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(p.read_text() for p in tmp_path.glob("rank*.txt")) == [
        "rank 0 exit 0 group alive False",
        "rank 1 exit 0 group alive False",
    ]
