"""Old import paths that keep working for one release after a module moves.

When a house change moves `finetune.predict` to `finetune.serve.predict`, users' code (`from finetune.predict import
EarlyExitClassifier`) must not break at once. Rather than leaving a shim file behind for every moved module (which
would keep the old flat layout on disk, the thing the move was for), the package that moved modules declares one table
in its `__init__`:

    alias_moved_modules({"finetune.predict": "finetune.serve.predict", "finetune.early_exit": "finetune.serve.…"})

and a finder on `sys.meta_path` answers an import of an old name with the module at its new path — the very same
module object, so classes, `isinstance` checks and pickles agree — after a `DeprecationWarning` that names the new
path, attributed to the line that imported the old one. A moved package carries its sub-modules along
(`finetune.early_exit.rules` → `finetune.serve.early_exit.rules`), never loading a file twice under two names.
Run as a program (`python -m finetune.predict_cli`), an old name answers with its new one and how commands run now.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import CodeType, ModuleType


def _caller_stacklevel() -> int:
    """The `stacklevel`, for a warning raised in our caller, of the user's import line: `warnings.warn` skips the
    import system's frozen frames itself, so only the frames it counts are counted (this file's, `importlib`'s)."""
    frame, level = sys._getframe(1), 1
    ours = (__file__, importlib.__file__)
    while frame.f_back is not None:
        frame = frame.f_back
        name = frame.f_code.co_filename
        if "importlib" in name and "_bootstrap" in name:
            continue
        level += 1
        if name not in ours:
            break
    return level


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves old module names (and anything under an old package name) to their new modules."""

    def __init__(self) -> None:
        self.moved: dict[str, str] = {}

    def new_name(self, fullname: str) -> str | None:
        if fullname in self.moved:
            return self.moved[fullname]
        for old, new in self.moved.items():
            if fullname.startswith(old + "."):
                return new + fullname[len(old) :]
        return None

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if self.new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = self.new_name(spec.name)
        assert new is not None
        warnings.warn(
            f"{spec.name} moved to {new}; the old import path works until the next release",
            DeprecationWarning,
            stacklevel=_caller_stacklevel(),
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was imported (and executed) under its new name."""

    def get_code(self, fullname: str) -> CodeType:
        """What `python -m OLD` runs (runpy asks the loader for the module's code): one line naming the new module
        and how its commands run now, exit 2 - never the module run under its old name, nor a traceback."""
        new = self.new_name(fullname)
        top = fullname.split(".")[0]
        message = (
            f"python -m {fullname}: {fullname} moved to {new} in this version; commands run as "
            f"`python -m {top} COMMAND` (`python -m {top} --help` lists them)"
        )
        return compile(f"import sys\nprint({message!r}, file=sys.stderr)\nraise SystemExit(2)\n", fullname, "exec")


_FINDER = _MovedModuleFinder()


def alias_moved_modules(moved: dict[str, str]) -> None:
    """Make each old module name in `moved` import its new module (with a DeprecationWarning). Idempotent."""
    _FINDER.moved.update(moved)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


__all__ = ["alias_moved_modules"]
