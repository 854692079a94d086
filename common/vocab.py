"""The [UNK]-rate guard's threshold and wording, shared by every stage that tokenizes text: data_prep (tokenize,
finalize, stats), pretrain (a prepared corpus's manifest) and finetune (training data and `predict` inputs).

Why a guard on the [UNK] rate: a vocabulary that does not fit the text (a 3-word vocab, an uncased vocab with
lower-casing off, another script, a tokenizer of another model) still tokenizes "successfully", and training then
spends its compute on [UNK]s.
"""

from __future__ import annotations

# The [UNK] share of all tokens above which `tokenize` and `finalize` refuse a corpus (`--max-unk-fraction`),
# `pretrain` too (it reads `totals.unk_tokens` / `totals.tokens` of manifest.json), and `finetune train` / `predict`.
# Measured by bench/unk_rates.py on ../shared/data/corpus (104 English Gutenberg books = 15.6 M tokens, 1 Spanish
# book, WikiText-2 test), documents read as `tokenize` reads them; [UNK] share of all tokens (per-book range):
#   bert-base-uncased (matching)             0.0016 % Gutenberg (books 0-0.12 %), 0.011 % WikiText, 0 % Spanish
#   the same vocab with lower-casing off     8.9 % Gutenberg (books 2.7-55 %), 16 % WikiText
#   a Cyrillic-script WordPiece (30k)        71 % Gutenberg (books 52-80 %), 72 % WikiText
#   a 3-word vocab (the, of, and)            90 % Gutenberg (books 84-98 %), 88 % WikiText
# 1 % is 8x the worst single book of the matching vocab and below every single book of the wrong ones. What it does
# not catch is another language in the same script (a Spanish WordPiece on English: 1.7 %, books 0.15-8.5 %); what it
# does refuse is a weak self-trained vocab on text it never saw (a cased 30k WordPiece trained on 20 books: 0.06 % on
# Gutenberg, 2.1 % on WikiText's non-Latin characters): --max-unk-fraction accepts such a corpus knowingly.
DEFAULT_MAX_UNK_FRACTION = 0.01


def unk_fraction(unk: int, tokens: int) -> float:
    return unk / tokens if tokens else 0.0


def describe_unk(unk: int, tokens: int) -> str:
    """'0.0123 % [UNK] (12 of 97,561 tokens)'."""
    return f"{100 * unk_fraction(unk, tokens):.3g} % [UNK] ({unk:,} of {tokens:,} tokens)"
