"""common.moved_modules: an old import path gives the new module itself, after a DeprecationWarning that names the
new path and points at the importing line; a moved package carries its sub-modules; unknown names are untouched."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

from common.moved_modules import alias_moved_modules


@pytest.fixture
def package(tmp_path, monkeypatch):
    root = tmp_path / "movedpkg"
    (root / "serve" / "early").mkdir(parents=True)
    for init in (root, root / "serve", root / "serve" / "early"):
        (init / "__init__.py").write_text("")
    (root / "serve" / "predict.py").write_text("class Classifier:\n    pass\n")
    (root / "serve" / "early" / "rules.py").write_text("RULES = {'entropy': 1}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    alias_moved_modules({"movedpkg.predict": "movedpkg.serve.predict", "movedpkg.early": "movedpkg.serve.early"})
    yield "movedpkg"
    for name in [n for n in sys.modules if n == "movedpkg" or n.startswith("movedpkg.")]:
        del sys.modules[name]


def test_an_old_path_is_the_new_module_with_a_warning_at_the_import_line(package):
    with pytest.warns(DeprecationWarning, match=r"movedpkg\.predict moved to movedpkg\.serve\.predict") as caught:
        from movedpkg.predict import Classifier  # noqa: PLC0415
    new = importlib.import_module("movedpkg.serve.predict")
    assert Classifier is new.Classifier and sys.modules["movedpkg.predict"] is new
    assert caught[0].filename == __file__


def test_a_moved_package_carries_its_sub_modules(package):
    with pytest.warns(DeprecationWarning, match=r"movedpkg\.early\.rules moved to movedpkg\.serve\.early\.rules"):
        old = importlib.import_module("movedpkg.early.rules")
    assert old is importlib.import_module("movedpkg.serve.early.rules") and old.RULES == {"entropy": 1}


def test_new_paths_and_unknown_names_are_untouched(package):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.import_module("movedpkg.serve.predict")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("movedpkg.nowhere")


def test_import_module_of_an_old_path_warns_at_its_caller(package):
    with pytest.warns(DeprecationWarning) as caught:
        importlib.import_module("movedpkg.predict")
    assert caught[0].filename == __file__
