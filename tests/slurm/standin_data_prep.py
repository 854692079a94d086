"""Stand-in for `python -m data_prep` in the Slurm tests: same CLI shape, records what it was asked to do.

tokenize INPUTS... --output OUT --tokenizer VOCAB --num-tasks J --task-index j [--max-unk-fraction F]
    -> OUT/shard-j-of-J.json (exits 1 when STANDIN_FAIL_INDEX == j)
finalize OUT [--max-unk-fraction F] -> OUT/manifest.json listing the shards (and F); exits 1 unless shard 0..J-1 of
    one J are all there
"""

import argparse
import glob
import json
import os
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser(prog="standin_data_prep")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokenize")
    t.add_argument("inputs", nargs="+")
    t.add_argument("--output", required=True)
    t.add_argument("--tokenizer", required=True)
    t.add_argument("--num-tasks", type=int, required=True)
    t.add_argument("--task-index", type=int, required=True)
    t.add_argument("--max-unk-fraction", type=float, default=None)
    f = sub.add_parser("finalize")
    f.add_argument("directory")
    f.add_argument("--max-unk-fraction", type=float, default=None)
    a = p.parse_args()
    if a.cmd == "tokenize":
        os.makedirs(a.output, exist_ok=True)
        rec = {
            "inputs": a.inputs,
            "tokenizer": a.tokenizer,
            "num_tasks": a.num_tasks,
            "task_index": a.task_index,
            "max_unk_fraction": a.max_unk_fraction,
            "array_task": os.environ.get("SLURM_ARRAY_TASK_ID"),
            "job": os.environ.get("SLURM_JOB_ID"),
            "time": time.time(),
        }
        if os.environ.get("STANDIN_FAIL_INDEX") == str(a.task_index):
            print(f"failing shard {a.task_index} on purpose", flush=True)
            return 1
        with open(os.path.join(a.output, f"shard-{a.task_index}-of-{a.num_tasks}.json"), "w") as fh:
            json.dump(rec, fh)
        return 0
    shards = [json.load(open(x)) for x in sorted(glob.glob(os.path.join(a.directory, "shard-*.json")))]
    counts = {s["num_tasks"] for s in shards}
    ok = len(counts) == 1 and sorted(s["task_index"] for s in shards) == list(range(counts.pop()))
    with open(os.path.join(a.directory, "manifest.json"), "w") as fh:
        record = {"shards": shards, "ok": ok, "job": os.environ.get("SLURM_JOB_ID"), "time": time.time()}
        json.dump({**record, "max_unk_fraction": a.max_unk_fraction}, fh)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
