"""`train.compile`: the compiled step computes what the eager step computes (losses and gradients, gradient
equilibrium and dropout included), and a compiled run under ZeRO-2 with 2 processes resumes exactly."""

from __future__ import annotations

import json

import pytest
import torch
from pretrain_testlib import TINY, launch_torchrun, read_metrics, train_args

from pretrain.collation import to_device
from pretrain.config import load_config
from pretrain.corpora import open_corpus
from pretrain.data import collate
from pretrain.metrics import latest_per_step
from pretrain.model_setup import compile_model, model_from_scratch

pytestmark = pytest.mark.slow
STEPS, SAVE_AT = 8, 4
COMPILED = [f"train.train_steps={STEPS}", f"checkpoint.interval={SAVE_AT}", "train.zero_stage=2"]
COMPILED += [
    "train.compile=true",
    "data.packing=false",
    "checkpoint.dump_final_weights=true",
    "logging.tensorboard=false",
]
COMPILED += [f"eval.interval={SAVE_AT}", "eval.max_samples=32"]  # validation: another graph (eval mode, all exits)


def _batch(seed: int, rows: int, pad_to: int, vocab: int = 400):
    g = torch.Generator().manual_seed(seed)
    items = []
    for length in (pad_to, pad_to - 31, pad_to - 8, pad_to // 2)[:rows]:  # ragged: padding, mask in the graph
        ids = torch.randint(5, vocab, (length,), generator=g).numpy()
        labels = torch.full((length,), -100)
        pick = torch.rand(length, generator=g) < 0.2
        labels[pick] = torch.from_numpy(ids)[pick]
        types = (torch.arange(length) >= length // 2).long().numpy()
        items.append({"input_ids": ids, "token_type_ids": types, "mlm_labels": labels.numpy(), "sop_label": seed % 2})
    return collate(items, pad_id=0, multiple=pad_to)


def test_the_compiled_model_computes_the_eager_losses_and_gradients(prepared_gutenberg):
    """Dropout on, and the same seed before each: the compiled graph draws the eager run's dropout masks
    (`elasticbert.dropout`), so both compute the same numbers: every exit group, with gradient equilibrium (a
    custom autograd function inside the graph), and a batch with another number of masked tokens (the dynamic
    size). That number is marked dynamic where the trainer moves a batch to the device (`to_device`), so each
    group compiles once: three graphs per group (the encoder, the heads up to the eager MLM loss, the rest), none
    compiled again for another count.

    The model and the batch shape are those of the compiled run below (its config, its corpus's vocabulary, its
    micro-batch padded to `data.max_length`): the graphs compiled here are then in inductor's cache when that run's
    two ranks start, which otherwise both compile them (a cold 2-rank launch: 132 CPU-s; after this test: 62,
    docs/test_time.md)."""
    from torch._dynamo.utils import counters

    cfg = load_config(TINY, COMPILED)
    vocab = int(open_corpus(prepared_gutenberg, "train").special_ids["vocab_size"])
    groups = cfg.exit_groups()
    torch.manual_seed(0)
    eager = model_from_scratch(cfg.model, vocab).train()
    compiled = model_from_scratch(cfg.model, vocab).train()
    compiled.load_state_dict(eager.state_dict())
    compile_model(compiled, num_groups=len(groups))
    graphs_before = counters["stats"]["unique_graphs"]
    masked_counts = {}
    for seed in (1, 2, 3, 4):
        exits = groups[(seed - 1) % len(groups)]
        batch = to_device(_batch(seed, cfg.train.micro_batch_size, cfg.data.max_length), "cpu")
        masked_counts.setdefault(exits, set()).add(int(batch["mlm_positions"].numel()))
        outs = []
        for model in (eager, compiled):
            model.zero_grad(set_to_none=True)
            torch.manual_seed(100 + seed)
            out = model(**batch, active_exits=exits, gradient_equilibrium=True)
            out.loss.backward()
            outs.append((out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
        (a, grads_a), (b, grads_b) = outs
        assert b.exit_layers == exits and b.num_masked == a.num_masked
        torch.testing.assert_close(b.loss, a.loss, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b.mlm_loss, a.mlm_loss, rtol=1e-5, atol=1e-5)
        assert grads_a.keys() == grads_b.keys()
        for name in grads_a:
            torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-4, atol=1e-6, msg=name)
    assert sorted(masked_counts) == sorted(groups) and all(len(c) == 2 for c in masked_counts.values())  # two counts
    assert counters["stats"]["unique_graphs"] - graphs_before == 3 * len(groups)  # ...and no group compiled twice


@pytest.fixture(scope="module")
def compiled_runs(tmp_path_factory, prepared_gutenberg):
    """An uninterrupted compiled run, and one stopped at step 4 (checkpoint) and restarted to the end."""
    work = tmp_path_factory.mktemp("compiled")
    runs = {}
    for name, phases in (("whole", [[]]), ("resumed", [[f"train.stop_after_steps={SAVE_AT}"], []])):
        run = work / name
        for extra in phases:
            launch = launch_torchrun(train_args(TINY, run, prepared_gutenberg, COMPILED + extra), 2, work / "log")
            assert launch.wait(timeout=600) == [0], launch.output()
        runs[name] = run
    return runs


def test_a_compiled_zero2_run_learns_and_resumes_exactly(compiled_runs):
    from safetensors.torch import load_file

    whole, resumed = (latest_per_step(read_metrics(compiled_runs[k])) for k in ("whole", "resumed"))
    starts = [json.loads(line) for line in (compiled_runs["resumed"] / "events.jsonl").read_text().splitlines()]
    starts = [e for e in starts if e["event"] == "start"]
    assert [s["resumed_from"] for s in starts] == [None, f"global_step{SAVE_AT}"]
    for step in range(1, STEPS + 1):
        a, b = whole[step], resumed[step]
        assert a["samples_digest"] == b["samples_digest"] and a["active_exits"] == b["active_exits"]
        assert abs(a["loss"] - b["loss"]) <= 1e-6, f"step {step}: {b['loss']} vs {a['loss']}"
        assert round(a["tokens"] / (1 - a["padding_fraction"])) == 16 * 128  # every batch at data.max_length
    assert whole[STEPS - 1]["loss"] < whole[1]["loss"] and whole[STEPS]["loss"] < whole[2]["loss"]  # per group
    evals = [
        {r["step"]: r for r in map(json.loads, (compiled_runs[k] / "eval.jsonl").read_text().splitlines())}
        for k in ("whole", "resumed")
    ]
    assert sorted(evals[0]) == sorted(evals[1]) == [SAVE_AT, STEPS]
    for step in (SAVE_AT, STEPS):
        assert evals[0][step]["exits"] == [1, 2, 3, 4]
        assert evals[0][step]["mlm_loss"] == evals[1][step]["mlm_loss"]  # no dropout in eval: exact
    wa = load_file(compiled_runs["whole"] / "final_weights.safetensors")
    wb = load_file(compiled_runs["resumed"] / "final_weights.safetensors")
    assert wa.keys() == wb.keys() and all(not k.startswith("_orig_mod") for k in wa)
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
