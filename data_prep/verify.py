"""`verify DIR`: re-hash every shard and check each .idx against its .bin and the manifest; list every problem.

Checks per shard: both files present; .idx header (magic, version, dtype) valid; .bin size = tokens x itemsize;
sha256 of .bin and .idx equal the manifest's; the .bin hash recorded inside the .idx equals the real one (an .idx
from another shard is caught); counts agree with the manifest; offsets = cumulative lengths, lengths > 0, document
boundaries increasing from 0 to S; every id < vocab size; the [UNK] count of each split equals the manifest's (when
recorded). Then split and corpus totals, and the tokenizer files. A manifest that is not one (bad JSON, missing
keys) is reported as a problem, like a shard that cannot be read.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import numpy as np

from common.integrity import sha256_file
from common.io import read_object

from .errors import DataPrepError
from .shard_format import DTYPES, FORMAT, open_idx_arrays, read_idx_header
from .tokenizer import check_tokenizer_dir, load_meta

BLOCK_TOKENS = 1 << 22


def _scan_bin(path: Path, dtype: np.dtype, unk_id: int) -> tuple[str, int, int, int]:
    """(sha256, size, max id, [UNK] count) in one streaming pass."""
    h = hashlib.sha256()
    size = 0
    top = -1
    unk = 0
    buf = bytearray(BLOCK_TOKENS * dtype.itemsize)
    view = memoryview(buf)
    with open(path, "rb") as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            size += n
            usable = n - n % dtype.itemsize
            if usable:
                ids = np.frombuffer(buf, dtype=dtype, count=usable // dtype.itemsize)
                top = max(top, int(ids.max()))
                unk += int(np.count_nonzero(ids == unk_id))
    return h.hexdigest(), size, top, unk


ShardJob = tuple[str, str, dict[str, Any], str, int, int]  # out, split, shard record, dtype, vocab size, [UNK] id


def check_shard(job: ShardJob) -> tuple[list[str], int]:
    """Every problem with one shard (an empty list when it is sound) and its [UNK] count."""
    try:
        return _check_shard(job)
    except OSError as e:  # unreadable (permissions, I/O error)
        return [f"{e.filename or job[2].get('name')}: cannot read ({e.strerror or e})"], 0
    except (KeyError, TypeError, ValueError) as e:  # a damaged shard record in the manifest
        return [f"{Path(job[0]) / 'manifest.json'}: damaged shard record in split {job[1]!r} ({e!r})"], 0


def _check_shard(job: ShardJob) -> tuple[list[str], int]:
    out, split, rec, dtype_name, vocab_size, unk_id = job
    stem = Path(out) / split / rec["name"]
    idx, binp = stem.with_suffix(".idx"), stem.with_suffix(".bin")
    problems: list[str] = []
    for p in (idx, binp):
        if not p.is_file():
            problems.append(f"{p}: missing")
    if problems:
        return problems, 0
    dtype = np.dtype(dtype_name)
    try:
        header = read_idx_header(idx)
    except DataPrepError as e:
        problems.append(str(e))
        header = None
    if sha256_file(idx) != rec["idx_sha256"]:
        problems.append(f"{idx}: sha256 differs from the manifest (index modified or from another shard)")
    bin_sha, size, top, unk = _scan_bin(binp, dtype, unk_id)
    if size != rec["tokens"] * dtype.itemsize:
        problems.append(
            f"{binp}: {size} bytes, manifest says {rec['tokens']} tokens = {rec['tokens'] * dtype.itemsize} bytes"
            + (" (truncated)" if size < rec["tokens"] * dtype.itemsize else "")
        )
    if bin_sha != rec["bin_sha256"]:
        problems.append(f"{binp}: sha256 differs from the manifest (corrupted or modified token data)")
    if top >= vocab_size:
        problems.append(f"{binp}: token id {top} >= vocab size {vocab_size}")
    if header is None:
        return problems, unk
    if DTYPES[header.itemsize] != dtype:
        problems.append(f"{idx}: dtype {header.dtype}, manifest says {dtype}")
        return problems, unk
    if header.bin_sha256 != bin_sha:
        problems.append(f"{idx}: was written for another .bin (its recorded .bin sha256 does not match {binp.name})")
    got = (header.num_docs, header.num_sentences, header.num_tokens)
    want = (rec["docs"], rec["sentences"], rec["tokens"])
    if got != want:
        problems.append(f"{idx}: header docs/sentences/tokens {got} differ from the manifest's {want}")
    starts, lengths, bounds = (np.asarray(a) for a in open_idx_arrays(idx, header))
    if len(lengths):
        if int(lengths.min()) <= 0:
            problems.append(f"{idx}: {int((lengths <= 0).sum())} sentences with length <= 0")
        expect = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=expect[1:])
        if not np.array_equal(starts, expect):
            bad = int(np.argmax(starts != expect))
            problems.append(f"{idx}: sentence offsets are not the running sum of lengths (first at sentence {bad})")
    if int(lengths.astype(np.int64).sum()) != header.num_tokens:
        problems.append(f"{idx}: sentence lengths sum to {int(lengths.sum())}, header says {header.num_tokens} tokens")
    if len(bounds) != header.num_docs + 1 or int(bounds[0]) != 0 or int(bounds[-1]) != header.num_sentences:
        problems.append(f"{idx}: document boundaries do not run from 0 to {header.num_sentences}")
    elif header.num_docs and int(np.diff(bounds).min()) <= 0:
        problems.append(f"{idx}: document boundaries not strictly increasing (empty documents)")
    return problems, unk


def verify_dir(out_dir: str | os.PathLike, workers: int = 1) -> list[str]:
    """All problems found in a prepared directory ([] = verified). A directory that does not exist, or `workers`
    < 1, is a DataPrepError (bad input, not a damaged corpus)."""
    out = Path(out_dir)
    if not out.is_dir():
        found = "is a file, not a folder" if out.exists() else "no such directory"
        raise DataPrepError(f"{out}: {found} (verify takes a prepared-corpus directory: tokenize --output)")
    if workers < 1:
        raise DataPrepError(f"--workers must be >= 1 (got {workers})")
    mpath = out / "manifest.json"
    if not mpath.is_file():
        return [f"{mpath}: missing (tokenize/finalize has not finished)"]
    try:
        manifest = json.loads(mpath.read_bytes())
    except ValueError as e:
        return [f"{mpath}: not valid JSON ({e})"]
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return [f"{mpath}: not a data_prep manifest"]
    try:
        return _verify_manifest(out, mpath, manifest, workers)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return [f"{mpath}: damaged manifest (missing or invalid entry: {e!r}); prepare the corpus again"]


def _verify_manifest(out: Path, mpath: Path, manifest: dict[str, Any], workers: int) -> list[str]:
    problems: list[str] = []
    tok_dir = out / manifest["tokenizer"].get("dir", "tokenizer")
    try:
        problems += check_tokenizer_dir(tok_dir)
        if load_meta(tok_dir)["sha256"] != manifest["tokenizer"]["sha256"]:
            problems.append(f"{tok_dir}: tokenizer differs from the one recorded in the manifest")
    except DataPrepError as e:
        problems.append(str(e))
    vocab = int(manifest["tokenizer"]["vocab_size"])
    unk_id = int(manifest["tokenizer"]["special_ids"]["unk"])
    jobs = [
        (str(out), split, rec, manifest["dtype"], vocab, unk_id)
        for split, info in manifest["splits"].items()
        for rec in info["shards"]
    ]
    if workers > 1 and len(jobs) > 1:
        with mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn").Pool(workers) as pool:
            results = pool.map(check_shard, jobs, chunksize=1)
    else:
        results = [check_shard(j) for j in jobs]
    unk_counted = dict.fromkeys(manifest["splits"], 0)
    for job, (found, unk) in zip(jobs, results):
        problems += found
        unk_counted[job[1]] += unk
    totals = {"docs": 0, "sentences": 0, "tokens": 0}
    for split, info in manifest["splits"].items():
        if "unk_tokens" in info and info["unk_tokens"] != unk_counted[split]:
            problems.append(
                f"{mpath}: split {split!r} unk_tokens = {info['unk_tokens']} but its shards hold {unk_counted[split]}"
            )
        for key in totals:
            s = sum(r[key] for r in info["shards"])
            if s != info[key]:
                problems.append(f"{mpath}: split {split!r} {key} total {info[key]} != sum over its shards {s}")
            totals[key] += info[key]
        listed = {r["name"] for r in info["shards"]}
        for f in sorted((out / split).glob("shard_*")):
            if f.name.split(".")[0] not in listed:
                problems.append(f"{f}: stray shard file not in the manifest")
    if "unk_tokens" in manifest["totals"]:
        totals["unk_tokens"] = sum(unk_counted.values())
    for key, v in totals.items():
        if manifest["totals"].get(key) != v:
            problems.append(f"{mpath}: totals.{key} = {manifest['totals'].get(key)} but the splits sum to {v}")
    return problems


def summary(out_dir: str | os.PathLike) -> str:
    m = read_object(Path(out_dir) / "manifest.json", DataPrepError)
    n = sum(len(s["shards"]) for s in m["splits"].values())
    t = m["totals"]
    return f"{n} shards, {t['docs']:,} docs, {t['sentences']:,} sentences, {t['tokens']:,} tokens"
