"""`python -m demo`: ElasticBERT end to end on this machine.

Stage 1 (model): build ElasticBERT from the MiniLM package's BERT weights and run every exit on real sentences,
printing per-exit shapes, FLOPs and what the MLM head of each exit predicts for a masked word.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import BertTokenizer

from elasticbert import ElasticBertForPreTraining, load_pretrained, minilm_dir
from elasticbert.flops import sample_flops

SHARED_CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "corpus" / "wikitext-2-raw"
FALLBACK_SENTENCES = [
    "The river flows through the old town before it reaches the sea.",
    "She opened the letter and read it twice before she said a word.",
    "Early exiting lets easy inputs leave the network after a few layers.",
]


def real_sentences(n: int = 3) -> tuple[list[str], str]:
    """A few sentences of WikiText from ../shared when present, else built-in ones (said so)."""
    for path in sorted(SHARED_CORPUS.glob("*.raw")):
        with path.open(encoding="utf-8") as f:
            lines = [ln.strip() for ln in f if len(ln.split()) > 12 and not ln.strip().startswith("=")]
        picked = [ln.split(" . ")[0] + " ." for ln in lines[:n]]
        return picked, str(path)
    return FALLBACK_SENTENCES[:n], "built-in sentences (../shared/data not found)"


def stage_model() -> None:
    print("[1] model — ElasticBERT from the MiniLM package's BERT weights; every layer is an exit")
    model, report = load_pretrained(ElasticBertForPreTraining, minilm_dir())
    print(report)
    tokenizer = BertTokenizer.from_pretrained(minilm_dir())
    sentences, source = real_sentences()
    print(f"sentences from {source}:")
    for s in sentences:
        print("   ", s)
    enc = tokenizer(sentences, padding=True, truncation=True, max_length=64, return_tensors="pt")
    masked = enc["input_ids"].clone()
    masked[:, 2] = tokenizer.mask_token_id  # hide the second word piece of each sentence
    cfg = model.config
    with torch.no_grad():
        out = model.elasticbert(masked, enc["attention_mask"], enc["token_type_ids"], output_pooled=True)
    lengths = enc["attention_mask"].sum(1).tolist()
    print(f"{'exit':>4} {'hidden states':>16} {'pooled':>10} {'GFLOPs/sample (mean)':>22}  MLM guess at [MASK]")
    for layer, hidden, pooled in zip(out.exit_layers, out.exit_hidden_states, out.pooled_outputs):
        flops = sum(sample_flops(cfg, n, layer, exit_type="linear").total for n in lengths) / len(lengths)
        guess = model.cls.predictions.logits(layer, hidden[:, 2]).argmax(-1)
        words = " / ".join(tokenizer.convert_ids_to_tokens(guess.tolist()))
        print(f"{layer:>4} {str(tuple(hidden.shape)):>16} {str(tuple(pooled.shape)):>10} {flops / 1e9:>22.4f}  {words}")
    print("(MiniLM ships no MLM head: the exits' MLM guesses are random until pre-training — stage 2 trains them.)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    torch.manual_seed(0)
    stage_model()


if __name__ == "__main__":
    main()
