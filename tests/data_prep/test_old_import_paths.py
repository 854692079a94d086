"""The dedup modules moved into the `data_prep.dedup` package (issue 49): each old path (`data_prep.dedup_lsh`) still
imports, for one release, as the new module itself, after a DeprecationWarning naming the new path; the old entry
module `data_prep.dedup` is now the package and still gives its public names."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

import data_prep
from data_prep import MOVED_MODULES


def test_the_table_names_every_moved_module():
    assert sorted(MOVED_MODULES) == [
        f"data_prep.dedup_{name}"
        for name in ("evalsets", "lsh", "manifest", "plan", "report", "stages", "text", "write")
    ]


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_path_is_the_new_module_with_a_deprecation_warning(old):
    new = MOVED_MODULES[old]
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}") as caught:
        module = importlib.import_module(old)
    assert module is importlib.import_module(new) and module.__name__ == new
    assert caught[0].filename == __file__


def test_from_package_import_of_an_old_name_warns_too(monkeypatch):
    sys.modules.pop("data_prep.dedup_text", None)
    monkeypatch.delattr(data_prep, "dedup_text", raising=False)  # set by an earlier import of the old name
    with pytest.warns(DeprecationWarning, match=r"data_prep\.dedup_text moved to data_prep\.dedup\.text"):
        from data_prep import dedup_text  # noqa: PLC0415
    assert dedup_text is importlib.import_module("data_prep.dedup.text")


def test_the_old_entry_module_is_the_package_with_its_public_names():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from data_prep.dedup import DedupConfig, DedupRun, dedup_corpus  # noqa: PLC0415
        from data_prep.dedup.plan import DedupConfig as config  # noqa: PLC0415
        from data_prep.dedup.run import dedup_corpus as run  # noqa: PLC0415
    assert (DedupConfig, dedup_corpus) == (config, run) and DedupRun.__module__ == "data_prep.dedup.plan"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        importlib.import_module("data_prep.dedup").nothing  # noqa: B018


def test_tokenizing_needs_no_minhash_library():
    """`data_prep.pipeline` imports `data_prep.dedup.manifest`, which runs the package's `__init__`: the run (and
    rensa, of the `train` extra) is loaded only when `dedup_corpus` is first used."""
    probe = "import sys, data_prep; print(sorted({'rensa', 'data_prep.dedup.run'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["[]"]
