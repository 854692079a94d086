"""What a non-editable install (`pip install .`, a wheel) gives a user who has no checkout: the fine-tuning presets
ship inside the package, and the checkout-only entry points say so in one line instead of failing deep inside."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ["common", "elasticbert", "data_prep", "pretrain", "finetune", "demo"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The project installed with `pip install --target` from a copy of its sources (the build writes into the
    source tree, so never this checkout)."""
    root = tmp_path_factory.mktemp("install")
    src, target = root / "src", root / "site"
    src.mkdir()
    for name in ("setup.py", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*cmd, "--target", str(target), str(src)], check=True, timeout=300, capture_output=True)
    return target


def run_installed(installed: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(installed)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_fine_tuning_presets_ship_with_the_package(installed, tmp_path):
    probe = (
        "import finetune.config as r; print(r.__file__); "
        "print(' '.join(r.recipe_names())); print(' '.join(r.load_config_file(n).name for n in r.recipe_names()))"
    )
    res = run_installed(installed, tmp_path, "-c", probe)
    assert res.returncode == 0, res.stderr
    where, names, loaded = res.stdout.splitlines()
    assert Path(where).is_relative_to(installed)  # the installed copy, not this checkout
    shipped = sorted(p.stem for p in (REPO / "finetune" / "presets").glob("*.yaml"))
    assert len(shipped) >= 3 and names.split() == shipped and loaded.split() == shipped


def test_the_demo_outside_a_checkout_says_to_run_it_from_one(installed, tmp_path):
    res = run_installed(installed, tmp_path, "-m", "demo", "--output", str(tmp_path / "out"))
    assert res.returncode != 0
    assert "runs from a checkout of the repository" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()
