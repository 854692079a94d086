"""No private torch API on a path a user runs: the library's sources (not the tests, not bench/) reach no private torch
name — `torch._C`, `torch._anything`, `x._C`, `from torch._x import ...`, `getattr(torch, "_x")` — outside the one
guarded helper that needs one (TorchDynamo's recompile limit has no public setting). A private name can vanish in any
torch release: `torch._C._cuda_getDriverVersion()` did in 2.11, and every GPU start crashed with an AttributeError
before the first step (issue 51). Read by the AST, so comments and strings do not count and aliases do."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIBRARY = ("common", "elasticbert", "data_prep", "pretrain", "finetune", "demo")
GUARDED = "common/torch_private.py"  # the one module allowed private torch names, each inside a guarding `try`


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _torch_names(tree: ast.AST) -> set[str]:
    """Names bound to torch or one of its modules anywhere in the file (`import torch`, `import torch as th`,
    `from torch import cuda`, `from torch.nn import functional as F`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch" or alias.name.startswith("torch."):
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def private_torch_uses(source: str, path: str = "<source>") -> list[tuple[int, str, str]]:
    """(line, enclosing function or '', what) for every private torch name `source` reaches."""
    tree = ast.parse(source)
    torch_names = _torch_names(tree)
    found: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        what = None
        if isinstance(node, ast.Attribute) and (
            node.attr == "_C" or (_private(node.attr) and _root(node) in torch_names)
        ):
            what = ast.unparse(node)
        elif isinstance(node, ast.Import):
            what = next((a.name for a in node.names if a.name.startswith("torch.") and _private_path(a.name)), None)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            bad = _private_path(node.module) or any(_private(a.name) for a in node.names)
            what = f"from {node.module} import {', '.join(a.name for a in node.names)}" if bad else None
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            args = node.args
            if len(args) >= 2 and _root(args[0]) in torch_names and isinstance(args[1], ast.Constant):
                what = ast.unparse(node) if isinstance(args[1].value, str) and _private(args[1].value) else None
        if what is not None:
            found.append((node.lineno, function, what))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "")
    return sorted(set(found))


def _private_path(module: str) -> bool:
    return any(_private(part) for part in module.split("."))


def test_the_library_reaches_no_private_torch_name_outside_the_guarded_module():
    wrong = []
    for package in LIBRARY:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if rel != GUARDED:
                uses = private_torch_uses(path.read_text(encoding="utf-8"), rel)
                wrong += [f"{rel}:{line} in {function or '<module>'}: {what}" for line, function, what in uses]
    assert not wrong, (
        f"private torch names outside {GUARDED} (use the public API, or add a guarded helper there):\n"
        + ("\n".join(wrong))
    )


def test_every_private_name_in_the_guarded_module_is_inside_a_try_that_catches_its_absence():
    source = (REPO / GUARDED).read_text(encoding="utf-8")
    uses = private_torch_uses(source)
    assert uses, f"{GUARDED} uses no private name any more: remove it"
    guarded_lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Try):
            caught = {ast.unparse(h.type) for h in node.handlers if h.type is not None}
            if any("AttributeError" in c for c in caught):
                guarded_lines.update(range(node.body[0].lineno, node.body[-1].end_lineno + 1))
    unguarded = [f"{GUARDED}:{line}: {what}" for line, _, what in uses if line not in guarded_lines]
    assert not unguarded, "private torch names outside a try/except AttributeError:\n" + "\n".join(unguarded)


# the line that crashed every GPU start (common/torch_build.py before issue 51), in its function as it was
OLD_DRIVER_READ = """
def running_build_problem(local_rank: int = 0) -> str | None:
    import torch

    props = torch.cuda.get_device_properties(local_rank % torch.cuda.device_count())
    driver = torch._C._cuda_getDriverVersion()  # e.g. 12040
    driver_cuda = (driver // 1000, driver % 1000 // 10) if driver else None
    return build_problem((props.major, props.minor), torch.cuda.get_arch_list(), torch.version.cuda, driver_cuda)
"""


def test_the_scan_would_have_caught_the_old_driver_read():
    uses = private_torch_uses(OLD_DRIVER_READ)
    assert (6, "running_build_problem", "torch._C._cuda_getDriverVersion") in uses
    assert all(line == 6 for line, _, _ in uses)


def test_the_scan_sees_aliases_imports_and_getattr_and_not_public_names():
    source = textwrap.dedent(
        """
        import torch as th
        import torch._dynamo
        from torch import cuda
        from torch._C import _cuda_getDeviceCount
        from torch.utils.cpp_extension import _get_build_directory
        import numpy as np

        def f(x):
            th.cuda._lazy_init()
            cuda._is_in_bad_fork()
            getattr(th, "_C")
            x._C
            np._private_thing  # not torch
            return th.__version__, th.cuda.is_available(), th.version.cuda, x._base, "torch._C"
        """
    )
    whats = {what for _, _, what in private_torch_uses(source)}
    assert whats == {
        "torch._dynamo",
        "from torch._C import _cuda_getDeviceCount",
        "from torch.utils.cpp_extension import _get_build_directory",
        "th.cuda._lazy_init",
        "cuda._is_in_bad_fork",
        "getattr(th, '_C')",
        "x._C",
    }
