"""finetune's rooms (train/, score/, serve/): the modules that lived flat in finetune/ keep their old import paths for
one release, each answering with its new module after a DeprecationWarning (`finetune.MOVED_MODULES`); every command
still answers `python -m finetune CMD --help`."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import finetune
from finetune.__main__ import build_parser

REPO = Path(__file__).resolve().parents[2]


def test_the_public_class_imports_from_its_old_path_with_a_warning():
    from finetune.serve.predict import EarlyExitClassifier as new  # noqa: PLC0415

    sys.modules.pop("finetune.predict", None)
    with pytest.warns(DeprecationWarning, match=r"finetune\.predict moved to finetune\.serve\.predict") as caught:
        from finetune.predict import EarlyExitClassifier  # noqa: PLC0415
    assert EarlyExitClassifier is new
    assert caught[0].filename == __file__


@pytest.mark.parametrize(("old", "new"), sorted(finetune.MOVED_MODULES.items()))
def test_every_moved_module_imports_from_its_old_path(old, new):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert not (REPO / Path(*old.split("."))).with_suffix(".py").exists(), f"a shim file is left at {old}"


def test_a_moved_package_carries_its_sub_modules():
    sys.modules.pop("finetune.early_exit.rules", None)
    with pytest.warns(DeprecationWarning, match=r"finetune\.early_exit\.rules moved to finetune\.serve\.early_exit"):
        old = importlib.import_module("finetune.early_exit.rules")
    assert old is importlib.import_module("finetune.serve.early_exit.rules")


def test_new_paths_import_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for new in sorted(set(finetune.MOVED_MODULES.values())):
            importlib.import_module(new)


HELP_PROBE = """
import contextlib, io, runpy, sys
for command in sys.argv[1:]:
    sys.argv = ["finetune", command, "--help"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_module("finetune", run_name="__main__", alter_sys=True)
        except SystemExit as done:
            code = done.code
    print(command, code, out.getvalue().startswith(f"usage: finetune {command}"))
"""


def test_every_command_answers_help_through_python_m():
    """`python -m finetune CMD --help` (the module run as __main__, as `-m` does) for every command, in one process."""
    commands = sorted(build_parser()._subparsers._group_actions[0].choices)
    assert {"train", "evaluate", "early-exit", "predict", "export", "submission", "elue-score"} <= set(commands)
    proc = subprocess.run([sys.executable, "-c", HELP_PROBE, *commands], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:-1] == [f"{command} 0 True" for command in commands]
