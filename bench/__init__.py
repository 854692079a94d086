"""The benchmarks, by the stage they measure: data/, pretrain/, finetune/, serving/, gpu/ (docs/benches.md lists
every one); what they share is in harness.py. Not an installed package: each script puts the repository on its path.

The flat layout's module paths (`bench.trainer_overhead`, …) still import for one release, as the moved modules
themselves, with a DeprecationWarning naming the new path; its command lines run through the stubs left at the old
paths (bench/moved.py, which holds the one table of both).
"""

from bench.moved import MOVED
from common.moved_modules import alias_moved_modules

# bench.serving is now the serving/ folder: the old bench/serving.py forwards as a command only
alias_moved_modules(
    {
        f"bench.{old[:-3]}": "bench." + new[:-3].replace("/", ".")
        for old, new in MOVED.items()
        if old.endswith(".py") and old != "serving.py"
    }
)
