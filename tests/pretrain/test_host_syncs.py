"""The trainer's optimizer step makes ONE host sync of its own (the read of the reduced step sums), counted here on
the CPU with the real Trainer and DeepSpeed engine (`bench/host_syncs.py`: every `.item()`, `float()`, `bool()`,
`.tolist()`, `.cpu()`, `.numpy()` and device synchronize, with the frame that made it). On a GPU each such read stops
the host from queuing the next kernels while the device works; a CPU hides the cost, not the calls.

And every guard still works through that one read: a NaN loss or an infinite gradient norm stops the run at that
very step, a preemption vote saves and exits at the step boundary, and the step records are all written."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
import torch
from pretrain_testlib import REPO, TINY, read_metrics

from common.errors import EXIT_PREEMPTED
from pretrain.config import load_config
from pretrain.guards import TrainingDiverged
from pretrain.trainer import Trainer

sys.path.insert(0, str(REPO))
from bench.host_syncs import count_host_syncs  # noqa: E402
from bench.trainer_overhead import synthetic_corpus  # noqa: E402

# what DeepSpeed 0.19.8's ZeRO-1 step still reads on the host with our config (docs/gpu.md): the validity of
# the gradient norm before clipping, once per parameter group (2: decay / no decay), plus, in fp32, once before the
# step; nothing else (its throughput timer's synchronize and bf16's overflow check are configured off)
DEEPSPEED_SYNCS = {"bf16": 2, "fp32": 3}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return synthetic_corpus(tmp_path_factory.mktemp("synthetic"), docs=120)


def started(tmp_path: Path, corpus: Path, precision: str, *sets: str) -> Trainer:
    """A Trainer set up in this process (process group of one, engine built), ZeRO-1, accumulation 2."""
    overrides = [
        f"data.corpora=[{{name: synthetic, path: {corpus}, weight: 1.0}}]",
        "data.max_length=64",
        "train.micro_batch_size=4",
        "train.global_batch_size=8",
        "train.train_steps=20",
        f"train.precision={precision}",
        "train.ds_config=ds_configs/zero1.json",
        "checkpoint.interval=100",
        "logging.tensorboard=false",
        *sets,
    ]
    trainer = Trainer(load_config(TINY, overrides), tmp_path / "run", None, force_resume=False)
    trainer._setup()
    trainer._announce()
    return trainer


def finish(trainer: Trainer) -> None:
    """Close it; the process group stays for the next test (DeepSpeed keeps its groups across engines)."""
    trainer.metrics.close()
    trainer.lock.release()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_trainers_step_reads_the_host_once(tmp_path, corpus, precision, clean_env):
    trainer = started(tmp_path, corpus, precision, "logging.tb_interval=2")
    try:
        batches = iter(trainer.loader)
        for _ in range(3):  # DeepSpeed's throughput timer starts synchronizing at its third step when it is on
            trainer.optimizer_step(batches)
        with count_host_syncs() as syncs:
            for _ in range(3):
                with syncs.step():
                    trainer.optimizer_step(batches)
        report = syncs.report()
        assert syncs.per_step("trainer") == [1, 1, 1], report
        ours = {s.where for s in syncs.sources() if s.origin == "trainer"}
        assert len(ours) == 1 and next(iter(ours)).startswith("pretrain/stats.py:"), report  # reduce_to_host
        assert syncs.per_step("deepspeed") == [DEEPSPEED_SYNCS[precision]] * 3, report
        assert not [s for s in syncs.sources() if "synchronize" in s.kind], report
        assert trainer.step == 6
        assert len(read_metrics(trainer.run_dir)) == 6  # every record of an interval written at its end
    finally:
        finish(trainer)
    assert [r["step"] for r in read_metrics(trainer.run_dir)] == list(range(1, 7))


def test_a_step_with_logging_samples_reads_only_the_host_keys_more(tmp_path, corpus, clean_env):
    trainer = started(tmp_path, corpus, "fp32", "logging.log_samples=true")
    try:
        batches = iter(trainer.loader)
        trainer.optimizer_step(batches)
        with count_host_syncs() as syncs, syncs.step():
            trainer.optimizer_step(batches)
        extra = [s for s in syncs.sources() if s.origin == "trainer" and not s.where.startswith("pretrain/stats.py")]
        # the DataLoader's keys tensor, never moved to the device: one .tolist() per micro-batch, no device sync
        assert [(s.kind, s.where.split(":")[0]) for s in extra] == [("Tensor.tolist", "pretrain/trainer.py")]
        assert syncs.sources()[extra[0]] == trainer.layout.grad_accum
    finally:
        finish(trainer)


def test_a_nan_loss_stops_the_run_at_that_very_step(tmp_path, corpus, clean_env):
    trainer = started(tmp_path, corpus, "bf16", "logging.tb_interval=10")
    try:
        batches = iter(trainer.loader)
        trainer.optimizer_step(batches)
        trainer.optimizer_step(batches)
        with torch.no_grad():  # every token passes the embeddings' LayerNorm
            trainer.engine.module.elasticbert.embeddings.LayerNorm.weight.fill_(float("nan"))
        with pytest.raises(TrainingDiverged, match="non-finite loss \\(nan\\) at step 3"):
            trainer.optimizer_step(batches)
    finally:
        finish(trainer)
    steps = [(r["step"], r["loss"]) for r in read_metrics(trainer.run_dir)]
    assert steps[:2] == [(1, steps[0][1]), (2, steps[1][1])] and steps[2] == (3, "nan")  # written before the stop
    events = [json.loads(line) for line in (trainer.run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "diverged"] == [3]
    assert not list((trainer.run_dir / "checkpoints").glob("global_step*"))  # nothing saved


def test_an_infinite_gradient_norm_on_the_device_stops_the_run(tmp_path, corpus, clean_env, monkeypatch):
    trainer = started(tmp_path, corpus, "bf16")
    try:
        batches = iter(trainer.loader)
        trainer.optimizer_step(batches)
        inf = torch.tensor(float("inf"))  # a device tensor, as ZeRO 1-2 return it: read only at the step's end
        monkeypatch.setattr(trainer.engine, "get_global_grad_norm", lambda: inf)
        with pytest.raises(TrainingDiverged, match="non-finite gradient norm \\(inf\\) at step 2"):
            trainer.optimizer_step(batches)
    finally:
        finish(trainer)


def test_a_preemption_vote_saves_at_the_step_boundary(tmp_path, corpus, clean_env):
    trainer = started(tmp_path, corpus, "fp32", "logging.tb_interval=10")
    try:
        batches = iter(trainer.loader)
        assert trainer.optimizer_step(batches) is None
        trainer.preempt.signum = signal.SIGUSR1  # what the handler records
        assert trainer.optimizer_step(batches) == EXIT_PREEMPTED
        assert trainer.checkpoints.committed(2)
    finally:
        finish(trainer)
    assert [r["step"] for r in read_metrics(trainer.run_dir)] == [1, 2]


def _records_of_two_steps(tmp_path: Path, corpus: Path, packing: bool) -> list[dict]:
    trainer = started(
        tmp_path,
        corpus,
        "fp32",
        f"data.packing={str(packing).lower()}",
        "data.short_seq_prob=0.5",
        "logging.peak_tflops=1.0",
        "model.hidden_dropout_prob=0.0",  # dropout masks are drawn per row: packed and padded would differ
        "model.attention_probs_dropout_prob=0.0",
    )
    try:
        batches = iter(trainer.loader)
        for _ in range(2):
            trainer.optimizer_step(batches)
    finally:
        finish(trainer)
    return read_metrics(trainer.run_dir)


def test_step_records_count_samples_rows_and_real_tokens_packed_or_not(tmp_path, corpus, clean_env):
    """The same samples packed or padded: the same samples and real tokens per step, fewer rows and less padding
    packed, and an MFU over real tokens only (the same useful work in both, so packed MFU = padded MFU x its time
    ratio). Without dropout the same step, so the same loss."""
    packed = _records_of_two_steps(tmp_path / "packed", corpus, True)
    padded = _records_of_two_steps(tmp_path / "padded", corpus, False)
    for p, q in zip(packed, padded):
        assert p["samples"] == q["samples"] == 8  # global batch: 2 micro-batches of 4 on one rank
        assert q["rows"] == 8 and p["rows"] <= q["rows"]
        assert p["tokens"] == q["tokens"] and p["loss"] == pytest.approx(q["loss"], rel=1e-5)
        assert p["padding_fraction"] <= q["padding_fraction"]
        useful_p = p["mfu"] * p["step_time_s"]
        useful_q = q["mfu"] * q["step_time_s"]
        assert useful_p == pytest.approx(useful_q, rel=1e-6)  # MFU's numerator: real work, not rows
    assert sum(p["rows"] for p in packed) < sum(q["rows"] for q in padded)  # some micro-batch did pack
