"""Pre-training step of ElasticBERT (all exits active) vs. two plain-`transformers` baselines, measured in one run.

    python bench/pretrain/model_step.py [--hidden 256 768] [--steps 4] [--compile]

Baselines, same sizes, same batches, same masking, same heads (per-exit MLM transform + one tied decoder, per-exit
pooler + SOP classifier), fwd + bwd + AdamW, fp32:
  naive    — `BertModel` with eager attention and `output_hidden_states=True`, MLM logits at every token;
  informed — the same with SDPA, the MLM head applied only at gathered masked positions.
--compile adds `train.compile`'s path (the same model after `model.compile()`, inductor) and, for context, the
informed baseline compiled the same way; compiled contestants get two warm-up steps (the second compiles the
masked-token count as dynamic).
Steps are interleaved (A B C A B C …) so machine noise hits all alike; the median step time is reported.
Useful FLOP/s counts the heads at masked positions only and is divided by the fp32 matmul peak measured here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, BertModel
from transformers.models.bert.modeling_bert import BertPooler, BertPredictionHeadTransform

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.harness import bert_size, matmul_peak  # noqa: E402
from elasticbert import ElasticBertConfig, ElasticBertForPreTraining  # noqa: E402
from elasticbert.flops import training_flops_per_token  # noqa: E402

VOCAB, LAYERS, SEQ, BATCH = 30522, 12, 128, 8


class PlainBertMultiExit(nn.Module):
    """transformers' BertModel + per-layer BERT heads, as one would write it without ElasticBERT."""

    def __init__(self, hidden: int, attn: str, sparse_mlm: bool) -> None:
        super().__init__()
        cfg = BertConfig(**bert_size(hidden, LAYERS, vocab=VOCAB), attn_implementation=attn)
        self.bert = BertModel(cfg, add_pooling_layer=False)
        self.transforms = nn.ModuleList([BertPredictionHeadTransform(cfg) for _ in range(LAYERS)])
        self.bias = nn.Parameter(torch.zeros(VOCAB))
        self.poolers = nn.ModuleList([BertPooler(cfg) for _ in range(LAYERS)])
        self.sop = nn.ModuleList([nn.Linear(hidden, 2) for _ in range(LAYERS)])
        self.sparse_mlm = sparse_mlm

    def forward(self, ids, mask, types, mlm_labels, sop_labels):
        states = self.bert(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True).hidden_states[1:]
        decoder = self.bert.embeddings.word_embeddings.weight
        flat = mlm_labels.reshape(-1)
        masked = (flat != -100).nonzero(as_tuple=True)[0]
        loss = 0.0
        for layer, h in enumerate(states):
            if self.sparse_mlm:
                logits = F.linear(self.transforms[layer](h.reshape(-1, h.shape[-1])[masked]), decoder, self.bias)
                loss = loss + F.cross_entropy(logits, flat[masked])
            else:
                logits = F.linear(self.transforms[layer](h), decoder, self.bias)
                loss = loss + F.cross_entropy(logits.reshape(-1, VOCAB), flat, ignore_index=-100)
            loss = loss + F.cross_entropy(self.sop[layer](self.poolers[layer](h)), sop_labels)
        return loss


def make_batches(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        ids = torch.randint(1000, VOCAB, (BATCH, SEQ), generator=g)
        types = torch.zeros_like(ids)
        types[:, SEQ // 2 :] = 1
        labels = torch.full_like(ids, -100)
        pick = torch.rand(BATCH, SEQ, generator=g) < 0.15
        labels[pick] = ids[pick]
        ids = ids.masked_fill(pick, 103)
        batches.append((ids, torch.ones_like(ids), types, labels, torch.randint(0, 2, (BATCH,), generator=g)))
    return batches


def timed_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch, exits) -> float:
    """Seconds for one forward + backward + AdamW step."""
    ids, mask, types, mlm, sop = batch
    t = time.perf_counter()
    if isinstance(model, ElasticBertForPreTraining):
        loss = model(ids, mask, types, mlm_labels=mlm, sop_labels=sop, active_exits=exits).loss
    else:
        loss = model(ids, mask, types, mlm, sop)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 768])
    parser.add_argument("--steps", type=int, default=4, help="timed steps per contestant (after the warm-up)")
    parser.add_argument("--compile", action="store_true", help="add the compiled model (and compiled baseline)")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}; 12 layers, seq {SEQ}, batch {BATCH}, fp32")
    peak = matmul_peak(sizes=(2048,), reps=5)
    print(f"fp32 matmul peak (2048³, best of 5): {peak / 1e9:.0f} GFLOP/s")

    for hidden in args.hidden:
        cfg = ElasticBertConfig(**bert_size(hidden, LAYERS, vocab=VOCAB))
        ours = ElasticBertForPreTraining(cfg)
        exits = tuple(range(1, LAYERS + 1))
        contestants = {
            "naive (eager, dense MLM)": PlainBertMultiExit(hidden, "eager", sparse_mlm=False),
            "informed (SDPA, masked MLM)": PlainBertMultiExit(hidden, "sdpa", sparse_mlm=True),
            "ElasticBERT": ours,
        }
        if args.compile:
            compiled_ours = ElasticBertForPreTraining(cfg)
            compiled_ours.load_state_dict(ours.state_dict())
            compiled_ours.compile()  # what train.compile does (pretrain.model_setup.compile_model)
            compiled_informed = PlainBertMultiExit(hidden, "sdpa", sparse_mlm=True)
            compiled_informed.compile()
            contestants["informed, compiled"] = compiled_informed
            contestants["ElasticBERT, compiled"] = compiled_ours
        optims = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in contestants.items()}
        for m in contestants.values():
            m.train()

        warmup = 2 if args.compile else 1
        batches = make_batches(args.steps + warmup)
        times = {name: [] for name in contestants}
        for i, batch in enumerate(batches):
            for name in contestants:
                elapsed = timed_step(contestants[name], optims[name], batch, exits)
                if i >= warmup:
                    times[name].append(elapsed)
                elif "compiled" in name:
                    print(f"  ({name}: warm-up step {i + 1} took {elapsed:.0f} s, compiling)", flush=True)

        tokens = BATCH * SEQ
        mask_fraction = sum(int((b[3] != -100).sum()) for b in batches) / (len(batches) * tokens)
        useful = training_flops_per_token(cfg, exits, SEQ, mask_fraction) * tokens
        med = {name: statistics.median(ts) for name, ts in times.items()}
        print(f"\nhidden {hidden}: useful work {useful / 1e9:.1f} GFLOP/step (heads at masked positions only)")
        for name, t in med.items():
            print(
                f"  {name:30s} {t * 1000:8.0f} ms/step {tokens / t:8.0f} tokens/s  "
                f"MFU {useful / t / peak:6.1%} of fp32 peak"
            )
        ours_t = med["ElasticBERT"]
        print(f"  ratio vs naive:    {med['naive (eager, dense MLM)'] / ours_t:5.2f}x  (target >= 3.5x)")
        print(f"  ratio vs informed: {med['informed (SDPA, masked MLM)'] / ours_t:5.2f}x  (target >= 1.0x)")
        if args.compile:
            compiled_t = med["ElasticBERT, compiled"]
            print(
                f"  compiled ElasticBERT vs informed: {med['informed (SDPA, masked MLM)'] / compiled_t:5.2f}x "
                "(target >= 1.15x)"
            )
            print(f"  compiled ElasticBERT vs informed, compiled: {med['informed, compiled'] / compiled_t:5.2f}x")
            print(f"  compiled ElasticBERT vs eager ElasticBERT: {ours_t / compiled_t:5.2f}x")


if __name__ == "__main__":
    main()
