"""The benches' old paths, one release on: `python bench/serving.py ...` (and `bash bench/gpu_check.sh ...`) still
run, with one note on stderr naming the new path, as the moved modules do (`common/moved_modules.py`).

`MOVED` is the one table. Each old path keeps a stub of two lines that hands itself to `forward` (a Python stub
imports this module; a shell stub runs it: `exec python3 bench/moved.py "$0" "$@"`). `forward` replaces the process
with the new script, the same arguments and working directory, so its exit code, signals and output are the new
script's own. The stubs and this file go in the next release.

Standard library only: the shell stubs run it with whatever `python3` is on the PATH.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent

# old name in bench/ -> its path under bench/ now
MOVED = {
    "prep_throughput.py": "data/prep_throughput.py",
    "prep_scale.py": "data/prep_scale.py",
    "unk_rates.py": "data/unk_rates.py",
    "text_faults_overhead.py": "data/text_faults_overhead.py",
    "dedup_libraries.py": "data/dedup_libraries.py",
    "dedup_quality.py": "data/dedup_quality.py",
    "dedup_scale.py": "data/dedup_scale.py",
    "dedup_data.py": "data/dedup_data.py",
    "scale_data.py": "data/scale_data.py",
    "model_step.py": "pretrain/model_step.py",
    "step_profile.py": "pretrain/step_profile.py",
    "pretrain_step.py": "pretrain/pretrain_step.py",
    "packing.py": "pretrain/packing.py",
    "trainer_overhead.py": "pretrain/trainer_overhead.py",
    "host_syncs.py": "pretrain/host_syncs.py",
    "zero_memory.py": "pretrain/zero_memory.py",
    "slurm_scale.py": "pretrain/slurm_scale.py",
    "finetune_step.py": "finetune/finetune_step.py",
    "acl_overhead.py": "finetune/acl_overhead.py",
    "early_exit.py": "serving/early_exit.py",
    "serving.py": "serving/serving.py",
    "serving_batch1.py": "serving/serving_batch1.py",
    "serving_steps.py": "serving/serving_steps.py",
    "serving_layers.py": "serving/serving_layers.py",
    "serving_report.py": "serving/serving_report.py",
    "serving_forms.py": "serving/serving_forms.py",
    "serving_one_file.py": "serving/serving_one_file.py",
    "int8_batch_invariance.py": "serving/int8_batch_invariance.py",
    "int8_eager_per_token.py": "serving/int8_eager_per_token.py",
    "int8_static_probe.py": "serving/int8_static_probe.py",
    "gpu_check.sh": "gpu/gpu_check.sh",
    "gpu_wheels.sh": "gpu/gpu_wheels.sh",
    "gpu_bench.py": "gpu/gpu_bench.py",
    "queued_gpu.py": "gpu/queued_gpu.py",
    "serving_cuda.py": "gpu/serving_cuda.py",
}


def new_path(old: str | os.PathLike) -> Path:
    """The script that `old` (a path ending in one of MOVED's names) now is."""
    return BENCH / MOVED[Path(old).name]


def forward(old: str | os.PathLike, args: list[str]) -> None:
    """Run the new script in this process's place, with one note on stderr; never returns."""
    new = new_path(old)
    shown = f"bench/{new.relative_to(BENCH)}"
    print(
        f"note: bench/{Path(old).name} moved to {shown}; running that (the old path goes in the next release)",
        file=sys.stderr,
        flush=True,
    )
    if new.suffix == ".sh":
        os.execvp("bash", ["bash", str(new), *args])
    os.execv(sys.executable, [sys.executable, str(new), *args])


if __name__ == "__main__":  # a shell stub: python3 bench/moved.py OLD_PATH ARGS...
    forward(sys.argv[1], sys.argv[2:])
