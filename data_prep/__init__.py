"""Corpus -> tokenizer -> sharded memory-mapped token files (.bin/.idx) -> manifest; verify.

CLI: `python -m data_prep train-tokenizer|tokenize|finalize|verify|stats ...` (console script `elasticbert-data`).

Python API (what the demo, pretrain and the Slurm tests use):

    from data_prep import tokenize_corpus, finalize_dir, verify_dir, PreparedCorpus, minilm_vocab

    manifest = tokenize_corpus(["corpus/"], "out/", tokenizer=minilm_vocab(), workers=2,
                               shard_tokens=1 << 24, valid_fraction=0.01)
    # array task j of J (each writes its units; then one call merges them):
    tokenize_corpus(["corpus/"], "out/", tokenizer=vocab, num_tasks=J, task_index=j)
    finalize_dir("out/")
    assert verify_dir("out/") == []           # list of problems, empty when sound
    corpus = PreparedCorpus("out/", split="train")
    corpus.sentence(0), corpus.doc_sentence_range(0), corpus.sentence_lengths, corpus.doc_boundaries

Other entry points: `train_tokenizer(texts, out/"tokenizer", kind=...)`, `adopt_vocab(vocab_txt, out/"tokenizer")`,
`iter_corpus_texts(inputs)`, `corpus_stats(out)`, `PrepConfig` (all settings that change the output).
`tokenizer=` (CLI `--tokenizer`) also takes a WordPiece tokenizer.json, a model folder or a Hugging Face hub name
(`bert-base-uncased`, through the standard cache, offline respected: `common.hub.resolve_pretrained`).

Sanity: the manifest counts [UNK] tokens (`totals.unk_tokens`, `splits.<split>.unk_tokens`, beside
`totals.tokens`); `tokenize_corpus` / `finalize_dir` refuse a corpus above `max_unk_fraction` (CLI
`--max-unk-fraction`, default `common.vocab.DEFAULT_MAX_UNK_FRACTION` = 1 %, measured on the real corpora: see
there), `tokenize` after its first ~100k tokens; the threshold is in no hash. A vocab lacking special tokens gets
them appended with a warning naming the file and the tokens.
Errors a user can fix raise `data_prep.errors.DataPrepError` (a `common.errors.UserError`) naming the file (and
line): bad input, damaged files, out-of-range options, and failed writes (disk full: the output is left incomplete,
without manifest.json, and the same command resumes it).
File formats: `data_prep.shard_format`; output layout and resume rules: `data_prep.pipeline`; the plan and the unit
store: `data_prep.plan`; tokenizing units (the worker pool): `data_prep.workers`. Deduplication and
decontamination, the stage before `tokenize`: the `data_prep.dedup` package. Commands: `data_prep.cli` (the tokenizer
pipeline's) and `data_prep.dedup.cli`, assembled by `data_prep.__main__`.

The dedup modules were `data_prep/dedup_*.py` until they became the `data_prep.dedup` package: their old names import
the new modules, with a DeprecationWarning, until the next release (`MOVED_MODULES`).
"""

from __future__ import annotations

from common.moved_modules import alias_moved_modules

from .errors import DataPrepError
from .pipeline import finalize_dir, iter_corpus_texts, tokenize_corpus
from .plan import PrepConfig
from .reader import PreparedCorpus
from .stats import corpus_stats
from .tokenizer import adopt_vocab, minilm_vocab, train_tokenizer
from .verify import verify_dir

MOVED_MODULES = {  # old module -> new module (data_prep.dedup, the old module, is the package: same names)
    "data_prep.dedup_evalsets": "data_prep.dedup.evalsets",
    "data_prep.dedup_lsh": "data_prep.dedup.lsh",
    "data_prep.dedup_manifest": "data_prep.dedup.manifest",
    "data_prep.dedup_plan": "data_prep.dedup.plan",
    "data_prep.dedup_report": "data_prep.dedup.report",
    "data_prep.dedup_stages": "data_prep.dedup.stages",
    "data_prep.dedup_text": "data_prep.dedup.text",
    "data_prep.dedup_write": "data_prep.dedup.write",
}
alias_moved_modules(MOVED_MODULES)

__all__ = [
    "DataPrepError",
    "PrepConfig",
    "PreparedCorpus",
    "adopt_vocab",
    "corpus_stats",
    "finalize_dir",
    "iter_corpus_texts",
    "minilm_vocab",
    "tokenize_corpus",
    "train_tokenizer",
    "verify_dir",
]
