"""Batched early exit against batch size 1, and the thresholds that never / always fire."""

import math
import re

import pytest
import torch
from thresholds import threshold_in_widest_gap

from common.errors import ConfigError
from finetune.model import exit_logits
from finetune.serve.early_exit import (
    EntropyRule,
    LearnedExitHead,
    LearnedExitRule,
    MaxProbRule,
    PatienceRule,
    PCEERule,
    entropy_nats,
    make_rule,
    run_batch,
    run_dataset,
)


def _exit_outputs(model, split):
    with torch.no_grad():
        out = model(split.input_ids, attention_mask=split.attention_mask, token_type_ids=split.token_type_ids)
    return torch.stack(out.representations, 1), torch.stack(exit_logits(out), 1)  # [N, E, d], [N, E, K]


def _lte_head(dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    head = LearnedExitHead(dim)
    with torch.no_grad():
        head.linear.weight.copy_(torch.randn(1, dim, generator=g) * 0.3)
        head.linear.bias.zero_()
    return head.eval()


def _rule_for(strategy, model, split, regression=False):
    """A rule with a threshold chosen so that samples exit at several different layers."""
    reps, logits = _exit_outputs(model, split)
    inner = logits[:, :-1]  # the last exit always takes everyone left
    if strategy == "entropy":
        return make_rule("entropy", threshold_in_widest_gap(entropy_nats(inner), min_gap=1e-4), 2)
    if strategy == "maxprob":
        return make_rule("maxprob", threshold_in_widest_gap(torch.softmax(inner, -1).amax(-1), min_gap=1e-4), 2)
    if strategy == "pcee":
        return make_rule(
            "pcee", threshold_in_widest_gap(entropy_nats(inner) / math.log(2), min_gap=1e-4), 2, patience=2
        )
    if strategy == "patience" and not regression:
        return make_rule("patience", 1, 2)
    if strategy == "patience":
        deltas = (logits[:, 1:, 0] - logits[:, :-1, 0]).abs()
        return make_rule("patience", 1, 1, delta=threshold_in_widest_gap(deltas, min_gap=1e-4))
    if strategy == "lte":  # one head shares all exits, so its per-layer offsets dominate: split at the first exit
        head = _lte_head(reps.shape[-1])
        with torch.no_grad():  # centred and scaled on the first exit's representations, as the fixture's heads
            first = reps[:, 0]
            head.linear.weight.div_((first @ head.linear.weight.T).std() / 2)
            head.linear.bias.fill_(-float((first @ head.linear.weight.T).mean()))
            errors = head(first)
        return make_rule("lte", threshold_in_widest_gap(errors, min_gap=1e-4), model.config.num_labels, lte_head=head)
    raise AssertionError(strategy)


CASES = [
    ("entropy", "linear"),
    ("maxprob", "linear"),
    ("patience", "linear"),
    ("pcee", "linear"),
    ("lte", "linear"),
    ("patience", "regression"),
    ("lte", "regression"),
    ("entropy", "mha"),
]


@pytest.mark.parametrize("strategy,kind", CASES, ids=[f"{s}-{k}" for s, k in CASES])
def test_batched_equals_one_by_one(strategy, kind, classifier, regressor, mha_classifier, sst2_dev, stsb_dev):
    regression = kind == "regression"
    model, split = {
        "linear": (classifier, sst2_dev),
        "regression": (regressor, stsb_dev),
        "mha": (mha_classifier, sst2_dev),
    }[kind]
    rule = _rule_for(strategy, model, split, regression)
    batched, _ = run_dataset(model, split.batches(16), rule)
    single, _ = run_dataset(model, split.batches(1), rule)
    wanted = 2 if strategy == "lte" else 3
    assert len(set(batched.exit_layers.tolist())) >= wanted, f"threshold too extreme: {batched.exit_layers.tolist()}"
    assert torch.equal(batched.exit_layers, single.exit_layers)
    assert torch.equal(batched.exits_evaluated, single.exits_evaluated)
    if regression:
        torch.testing.assert_close(batched.predictions, single.predictions, atol=1e-2, rtol=0)
    else:
        assert torch.equal(batched.predictions, single.predictions)
    # The spread-out heads amplify padded-vs-unpadded float noise (~1e-6) by ~1e3; logits spread ~2 across samples.
    torch.testing.assert_close(batched.logits, single.logits, atol=1e-2, rtol=0)
    assert torch.equal(batched.lengths, split.lengths)


def test_unsorted_batches_give_the_same_result(classifier, sst2_dev):
    """Length-sorting is only a speed measure: file-order batches (more padding, more trimming) agree."""
    rule = _rule_for("entropy", classifier, sst2_dev)
    a, _ = run_dataset(classifier, sst2_dev.batches(16, sort_by_length=True), rule)
    b, _ = run_dataset(classifier, sst2_dev.batches(16, sort_by_length=False), rule)
    assert torch.equal(a.exit_layers, b.exit_layers) and torch.equal(a.predictions, b.predictions)


# Extremes inside each threshold's range at which no sample leaves before the last exit: `make_rule` refuses them
# (issue 47: they decide without the input), so the engine's "everyone runs to the end" path is driven through the
# rule classes themselves, as the always-firing one is.
NEVER = {
    "entropy": lambda head: EntropyRule(0.0),
    "maxprob": lambda head: MaxProbRule(1.0),
    "patience": lambda head: PatienceRule(5),  # 6 exits: at most 4 agreements before the last
    "pcee": lambda head: PCEERule(0.0, patience=1),
    "lte": lambda head: LearnedExitRule(0.0, head),
}
NEVER_SETTINGS = {"entropy": 0.0, "maxprob": 1.0, "patience": 5, "pcee": 0.0, "lte": 0.0}
# Thresholds at which a rule fires whatever the input: `make_rule` refuses them (issue 38, class 6), so the engine's
# "everyone leaves at exit 1" path is driven through the rule classes themselves.
ALWAYS = {
    "entropy": lambda head: EntropyRule(math.inf),
    "maxprob": lambda head: MaxProbRule(0.0),
    "patience": lambda head: PatienceRule(0),
    "pcee": lambda head: PCEERule(1.0, patience=1),
    "lte": lambda head: LearnedExitRule(2.0, head),
}


@pytest.mark.parametrize("strategy", list(NEVER))
def test_never_and_always_fire(strategy, classifier, sst2_dev):
    head = _lte_head(classifier.config.hidden_size)
    kwargs = dict(patience=1 if strategy == "pcee" else 2, lte_head=head)
    ids, mask, types = sst2_dev.input_ids[:16], sst2_dev.attention_mask[:16], sst2_dev.token_type_ids[:16]
    with torch.no_grad():
        full = exit_logits(classifier(ids, attention_mask=mask, token_type_ids=types))

    with pytest.raises(ValueError, match="no sample leaves before the last exit"):
        make_rule(strategy, NEVER_SETTINGS[strategy], 2, num_exits=6, **kwargs)
    never = run_batch(classifier, ids, mask, types, NEVER[strategy](head))
    assert never.exit_layers.eq(6).all() and never.exits_evaluated.eq(6).all()
    torch.testing.assert_close(never.logits, full[-1], atol=1e-5, rtol=0)

    always = run_batch(classifier, ids, mask, types, ALWAYS[strategy](head))
    assert always.exit_layers.eq(1).all() and always.exits_evaluated.eq(1).all()
    torch.testing.assert_close(always.logits, full[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "strategy,threshold,labels,message",
    [
        ("patience", 0, 2, "0 needs none, so every sample leaves at the first exit"),
        ("patience", 0, 1, "0 needs none"),  # regression too
        ("entropy", math.log(2), 2, "at most ln 2 = 0.693147 nats"),
        ("entropy", 0.6931, 2, "at τ >= ln 2 (to 4 decimals) every sample leaves at the first exit"),
        ("entropy", 1.0, 2, "at most ln 2"),
        ("entropy", 1.0986, 3, "at most ln 3"),
        ("maxprob", 0.5, 2, "at least 1/2 = 0.500000"),
        ("maxprob", 0.3333, 3, "at least 1/3"),
        ("maxprob", 0.2, 3, "at least 1/3"),
        ("pcee", 1.0, 2, "every exit counts as confident"),
    ],
)
def test_thresholds_that_decide_without_the_input_are_refused(strategy, threshold, labels, message):
    """Issue 38 class 6: a rule whose threshold sends every sample out at the same exit by construction is refused
    where a setting is checked once (`exit_setting.degenerate_problem`, through `make_rule`)."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        make_rule(strategy, threshold, labels)


@pytest.mark.parametrize(
    "strategy,threshold,labels",
    [("patience", 1, 2), ("entropy", 0.6930, 2), ("entropy", 0.7, 3), ("maxprob", 0.5001, 2), ("pcee", 0.9999, 2)],
)
def test_thresholds_just_inside_the_bounds_still_run(strategy, threshold, labels):
    assert make_rule(strategy, threshold, labels).threshold == threshold


def test_exit_subset_and_static_truncation(classifier, sst2_dev):
    ids, mask, types = sst2_dev.input_ids, sst2_dev.attention_mask, sst2_dev.token_type_ids
    with torch.no_grad():
        static3 = exit_logits(classifier(ids, attention_mask=mask, token_type_ids=types, exit_layers=[3]))[0]
    out = run_batch(classifier, ids, mask, types, EntropyRule(0.0), exit_layers=[3])  # (never fires)
    assert out.exit_layers.eq(3).all() and out.trace(0) == (3,)
    torch.testing.assert_close(out.logits, static3, atol=1e-5, rtol=0)


def test_patience_counts_consecutive_agreement():
    rule = make_rule("patience", 2, 2)
    state = rule.initial_state(3)
    steps = [[0, 1, 1], [0, 0, 1], [0, 0, 1], [1, 0, 0]]  # predicted class per sample, exit by exit
    fired = []
    for position, preds in enumerate(steps):
        logits = torch.nn.functional.one_hot(torch.tensor(preds), 2).float()
        fired.append(rule.decide(position, None, logits, state).tolist())
    # sample 0 (0,0,0,1) and sample 2 (1,1,1,0) agree twice by exit 3; sample 1 (1,0,0,0) only by exit 4
    assert [f[0] for f in fired] == [False, False, True, False]
    assert [f[1] for f in fired] == [False, False, False, True]
    assert [f[2] for f in fired] == [False, False, True, False]


def test_rule_validation():
    with pytest.raises(ValueError, match="regression"):
        make_rule("entropy", 0.1, 1)
    with pytest.raises(ValueError, match="LearnedExitHead"):
        make_rule("lte", 0.1, 2)
    with pytest.raises(ValueError, match="whole number"):
        make_rule("patience", 1.5, 2)
    # thresholds outside their range are refused, not run
    for strategy, threshold, range_text in [
        ("entropy", -0.1, "entropy in nats, >= 0"),
        ("maxprob", 1.5, "probability within [0, 1]"),
        ("maxprob", -0.01, "probability within [0, 1]"),
        ("patience", -1, "whole number of exits >= 0"),
        ("pcee", 1.2, "normalised entropy H / ln K within [0, 1]"),
        ("entropy", math.nan, "entropy in nats"),
    ]:
        with pytest.raises(ValueError, match=re.escape(range_text)):
            make_rule(strategy, threshold, 2)
    with pytest.raises(ValueError, match="unknown strategy"):
        make_rule("magic", 0.1, 2)


def test_left_padding_is_refused(classifier):
    ids = torch.tensor([[0, 101, 2000, 102], [101, 2000, 2001, 102]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match="right-padded"):
        run_batch(classifier, ids, mask, None, make_rule("entropy", 0.1, 2))
