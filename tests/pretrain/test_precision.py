"""The fp16 loss scaler's bookkeeping, on CPU where DeepSpeed cannot run fp16: a real ZeRO-1 engine given the
DynamicLossScaler DeepSpeed builds for fp16, a fake overflow (one gradient made inf), the step log and TensorBoard
fields, and the scaler's state through save -> load. The choice of precision per device is in test_config.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from pretrain_testlib import REPO, base_env

from common.dist import free_port
from pretrain.guards import step_problem

ENGINE_SCRIPT = textwrap.dedent(
    """
    import json, logging, os, sys
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
    import torch
    from common.deepspeed_import import import_deepspeed
    deepspeed = import_deepspeed("AdamW")  # as a training rank does: no shm op build on the CPU, no Muon compile
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler
    from pretrain.precision import FP16_DYNAMIC, step_precision_record

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    deepspeed.init_distributed("gloo", verbose=False)
    config = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
              "zero_optimization": {"stage": 1}, "steps_per_print": 10**9}

    def engine():
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        return deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)[0]

    e = engine()
    # the scaler DeepSpeed creates for fp16 from our FP16_DYNAMIC settings (hysteresis 1 here: halve at once)
    e.optimizer.loss_scaler = DynamicLossScaler(
        init_scale=2 ** 8, scale_window=FP16_DYNAMIC["loss_scale_window"], min_scale=FP16_DYNAMIC["min_loss_scale"],
        delayed_shift=1, consecutive_hysteresis=False, dtype=torch.float16)
    records = []
    for step in range(3):
        loss = e(torch.ones(2, 4)).sum()
        hook = e.module.weight.register_hook(lambda g: g * float("inf")) if step == 1 else None
        before = e.module.weight.detach().clone()
        e.backward(loss)
        e.step()
        if hook:
            hook.remove()
        rec = step_precision_record(e, "fp16")
        rec.update(changed=not torch.equal(before, e.module.weight.detach()), loss=float(loss.detach()),
                   grad_norm=float(e.get_global_grad_norm()))
        records.append(rec)
    e.save_checkpoint(sys.argv[1], tag="t", save_latest=False)
    fresh = engine()
    fresh.load_checkpoint(sys.argv[1], tag="t", load_lr_scheduler_states=False)
    print("RESULT " + json.dumps({"records": records, "scale": fresh.optimizer.loss_scale,
                                  "scaler": type(fresh.optimizer.loss_scaler).__name__,
                                  "skipped": fresh.skipped_steps}))
    """
)


@pytest.fixture(scope="module")
def fake_overflow(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fp16")
    script = tmp / "engine.py"
    script.write_text(ENGINE_SCRIPT)
    r = subprocess.run(
        [sys.executable, str(script), str(tmp / "ckpt"), str(free_port())],
        cwd=REPO,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(lines[0].removeprefix("RESULT "))


def test_a_fake_overflow_is_skipped_counted_and_lowers_the_scale(fake_overflow):
    ok, overflow, after = fake_overflow["records"]
    assert (ok["step_skipped"], ok["skipped_steps"], ok["loss_scale"], ok["changed"]) == (False, 0, 256.0, True)
    assert (overflow["step_skipped"], overflow["skipped_steps"], overflow["loss_scale"]) == (True, 1, 128.0)
    assert not overflow["changed"] and overflow["grad_norm"] == float("inf")  # DeepSpeed skipped the update
    assert (after["step_skipped"], after["skipped_steps"], after["loss_scale"], after["changed"]) == (
        False,
        1,
        128.0,
        True,
    )
    # the trainer's guard: an fp16 overflow DeepSpeed skipped is the scaler's normal work; in bf16/fp32 it is not
    assert step_problem(overflow["loss"], overflow["grad_norm"], True, "fp16") is None
    assert step_problem(overflow["loss"], overflow["grad_norm"], True, "fp32") == "non-finite gradient norm (inf)"
    assert step_problem(float("nan"), 1.0, False, "fp16") == "non-finite loss (nan)"


def test_the_loss_scaler_survives_save_and_load(fake_overflow):
    """DeepSpeed pickles the scaler into the ZeRO optimizer states and restores it; the skipped-step counter is in
    the model states: a resume continues with the lowered scale, not the initial 2^16."""
    assert fake_overflow["scaler"] == "DynamicLossScaler" and fake_overflow["scale"] == 128.0
    assert fake_overflow["skipped"] == 1


def test_loss_scale_and_skipped_steps_reach_the_step_log_and_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from pretrain.metrics import MetricsLogger, read_jsonl

    log = MetricsLogger(tmp_path, True, True, False, 3, 0)
    for step, (skipped, total, scale) in enumerate([(False, 0, 256.0), (True, 1, 128.0), (False, 1, 128.0)], 1):
        log.step(
            {
                "step": step,
                "loss": 1.0,
                "active_exits": [],
                "lr": 1e-3,
                "grad_norm": 1.0,
                "step_skipped": skipped,
                "skipped_steps": total,
                "loss_scale": scale,
            }  # fmt: skip
        )
    log.close()
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(r["step_skipped"], r["skipped_steps"], r["loss_scale"]) for r in records] == [
        (False, 0, 256.0),
        (True, 1, 128.0),
        (False, 1, 128.0),
    ]
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("train/loss_scale")] == [256.0, 128.0, 128.0]
    assert [e.value for e in acc.Scalars("train/skipped_steps")] == [0.0, 1.0, 1.0]
