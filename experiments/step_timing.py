"""Per-step time of the pre-training variants, measured interleaved in one process (one thread).

On a machine shared with other jobs, whole-run wall times are not comparable; ratios measured here are: each round
runs one full group cycle of every variant on the same real batches, so load drift hits all of them alike, and the
fastest round is kept (other processes only ever add time), as `bench/pretrain/pretrain_step.py` does. Both wall and CPU
(process) time are recorded.

Variants: G=2 (exit groups alternate), G=1 (every exit every step), last layer only (one MLM + SOP head), and the
encoder alone (no heads: the heads' share of a G=1 step is 1 − encoder ÷ G=1), in bf16 autocast and fp32.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

VARIANTS = {
    "minilm": (("G2", "fp32"), ("G2", "bf16"), ("G1", "bf16"), ("last", "bf16"), ("encoder", "bf16")),
    "base": (("G2", "bf16"), ("G1", "bf16"), ("encoder", "bf16"), ("G2", "fp32"), ("G1", "fp32"), ("encoder", "fp32")),
}


def real_batches(corpus_dir: Path, seq_len: int, batch: int, count: int) -> list[dict]:
    """`count` batches of full-length training samples (SOP + n-gram masking as in training)."""
    from pretrain.corpora import open_corpus
    from pretrain.data import MaskingConfig, PretrainingDataset, collate, load_or_build_index

    corpus = open_corpus(corpus_dir, "train")
    index, _, _ = load_or_build_index(corpus, "train", seq_len, 0.0, 0, [corpus_dir.parent / "timing_index_cache"])
    dataset = PretrainingDataset(corpus, index, MaskingConfig(seq_len, seed=0))
    samples = []
    for i in range(len(dataset)):
        item = dataset[i]
        if len(item["input_ids"]) == seq_len:
            samples.append(item)
        if len(samples) == batch * count:
            break
    pad = int(corpus.special_ids["pad"])
    return [collate(samples[b * batch : (b + 1) * batch], pad) for b in range(count)]


def groups_of(kind: str, layers: int) -> list[tuple[int, ...]]:
    from elasticbert import exit_groups

    if kind == "G2":
        return [tuple(g) for g in exit_groups(layers, 2)]
    if kind == "last":
        return [(layers,)]
    return [tuple(range(1, layers + 1))]  # G1, and the encoder (runs all layers)


def time_shape(shape: dict[str, int], variants: tuple, batches: list[dict], rounds: int) -> dict:
    """Interleaved rounds over `variants` on one model (random init: timing does not depend on the weights)."""
    import torch

    from elasticbert import ElasticBertConfig, ElasticBertForPreTraining

    torch.manual_seed(0)
    cfg = ElasticBertConfig(vocab_size=30522, max_position_embeddings=512, **shape)
    model = ElasticBertForPreTraining(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    layers = cfg.num_hidden_layers
    times: dict[str, list[tuple[float, float]]] = {f"{k}_{p}": [] for k, p in variants}

    def step(kind: str, precision: str, active: tuple[int, ...], batch: dict) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            if kind == "encoder":
                out = model.elasticbert(
                    batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"]
                )
                loss = out.last_hidden_state.float().square().mean()
            else:
                loss = model(**batch, active_exits=active, gradient_equilibrium=True).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0, time.process_time() - c0

    for r in range(rounds + 1):  # round 0 is a warm-up (allocator, autocast caches), not recorded
        for kind, precision in variants:
            groups = groups_of(kind, layers)
            cycle = [step(kind, precision, g, batches[(r + i) % len(batches)]) for i, g in enumerate(groups)]
            if r:
                wall = sum(c[0] for c in cycle) / len(cycle)
                cpu = sum(c[1] for c in cycle) / len(cycle)
                times[f"{kind}_{precision}"].append((wall, cpu))
    result = {
        name: {
            "wall_per_round": [w for w, _ in t],
            "cpu_per_round": [c for _, c in t],
            "wall_min": min(w for w, _ in t),
            "cpu_min": min(c for _, c in t),
            "wall_median": statistics.median(w for w, _ in t),
        }
        for name, t in times.items()
    }
    return {"shape": shape, "batch": len(batches[0]["input_ids"]), "step_s": result}


def exit_count_share_removed(layers: int) -> float:
    """Fraction of a G=1 step's exit heads that G=2 does not run, averaged over its two groups."""
    groups = groups_of("G2", layers)
    return 1.0 - sum(len(g) for g in groups) / len(groups) / layers


def ratios(shape_result: dict, layers: int) -> dict:
    """G=1 ÷ G=2 per-step time, heads' share of a G=1 step and the bound it puts on grouping's gain."""
    t = shape_result["step_s"]
    out = {}
    for precision in ("bf16", "fp32"):
        if f"G1_{precision}" not in t or f"G2_{precision}" not in t:
            continue
        for clock in ("wall_min", "cpu_min"):
            g1, g2 = t[f"G1_{precision}"][clock], t[f"G2_{precision}"][clock]
            entry = out.setdefault(precision, {})
            entry[f"g1_over_g2_{clock}"] = g1 / g2
            if f"encoder_{precision}" in t:
                share = 1.0 - t[f"encoder_{precision}"][clock] / g1
                entry[f"heads_share_g1_{clock}"] = share
                entry[f"bound_g1_over_g2_{clock}"] = 1.0 / (1.0 - share * exit_count_share_removed(layers))
            if f"last_{precision}" in t:
                entry[f"g1_over_last_{clock}"] = g1 / t[f"last_{precision}"][clock]
    if "G2_fp32" in t and "G2_bf16" in t:
        out["fp32_over_bf16_G2"] = {c: t["G2_fp32"][c] / t["G2_bf16"][c] for c in ("wall_min", "cpu_min")}
    return out


def step_timing(work: Path, scale: object, corpus_dir: Path) -> dict:
    """The timing unit shared by both pre-training experiments (cached under WORK/units/step_timing.json)."""
    import os

    from experiments.pretrain_lab import unit

    def compute() -> dict:
        timing = scale.timing
        load_start = os.getloadavg()[0]
        shapes = {}
        for name, shape in timing.shapes.items():
            batches = real_batches(corpus_dir, timing.seq_len, timing.batch[name], 2)
            result = time_shape(shape, VARIANTS[name], batches, timing.rounds)
            result["ratios"] = ratios(result, shape["num_hidden_layers"])
            shapes[name] = result
        return {
            "seq_len": timing.seq_len,
            "rounds": timing.rounds,
            "threads": 1,
            "loadavg_start": load_start,
            "loadavg_end": os.getloadavg()[0],
            "cpus": os.cpu_count(),
            "shapes": shapes,
        }

    return unit(work, "step_timing", compute)
