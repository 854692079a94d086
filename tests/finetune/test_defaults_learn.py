"""Defaults that learn (issue 17.7): the new user's command, with nothing but the defaults, learns on small real data.

`finetune train --model MiniLM --task SST-2 --exits --method 2st --exit-type mha --epochs 1 --max-train-examples 2000`
with the old default (exit heads at the backbone's 2e-5) scored the majority class at every exit (50.9 % on the full
dev set); with the default exit lr 1e-3 it scores 69.7 / 74.0 / 77.3 / 76.7 / 77.4 / 79.9 % (docs/finetuning.md).
At CI size - the same command on the same 2,000 training rows, sequences cut at 40 tokens, scored on 300 dev rows -
it measured 70.0 / 72.0 / 76.3 / 75.3 / 76.0 / 78.0 % against a majority class of 55.0 %. The bars: every exit at
least 8 points above the majority class of the scored rows (about 3 standard errors at n = 300), the last exit at
least 72 %.
"""

import json

from finetune.__main__ import main
from finetune.data import subsample
from finetune.tasks import load_split

DEV_ROWS = 300


def test_the_new_users_2st_mha_command_learns_at_every_exit(tmp_path, minilm, glue_dir):
    out = tmp_path / "run"
    argv = ["train", "--model", str(minilm), "--task", "SST-2", "--data-dir", str(glue_dir), "--output", str(out)]
    argv += ["--exits", "--method", "2st", "--exit-type", "mha", "--epochs", "1", "--max-train-examples", "2000"]
    argv += ["--max-length", "40", "--max-dev-examples", str(DEV_ROWS), "--no-progress"]  # CI size
    assert main(argv) == 0

    saved = json.loads((out / "run_config.json").read_text())
    optim, sources = saved["config"]["optim"], saved["sources"]
    assert optim["exit_lr"] == 1e-3 and optim["lr"] == 2e-5  # the defaults ran
    assert sources["optim.lr"] == sources["optim.exit_lr"] == "default"
    subset_seed = saved["config"]["data"]["dev_subset_seed"]
    labels = [e.label for e in subsample(load_split("SST-2", glue_dir, "dev"), DEV_ROWS, subset_seed)]
    majority = 100 * max(labels.count(0), labels.count(1)) / len(labels)
    accuracy = {
        int(k): v["accuracy"] for k, v in json.loads((out / "dev_scores.json").read_text())["best"]["exits"].items()
    }
    assert sorted(accuracy) == [1, 2, 3, 4, 5, 6]
    assert all(acc >= majority + 8 for acc in accuracy.values()), (accuracy, majority)
    assert accuracy[6] >= 72.0, accuracy
