"""The import graph reads one way (README, "Layout"): `common` at the bottom; `elasticbert` and `data_prep` on it;
`pretrain` on those; `finetune` on `elasticbert` only; `bench/`, `experiments/` and `demo/` on top. Every import
counts, including those inside functions, so a cycle cannot hide in one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ALLOWED = {
    "common": set(),
    "elasticbert": {"common"},
    "data_prep": {"common"},
    "pretrain": {"common", "elasticbert", "data_prep"},
    "finetune": {"common", "elasticbert"},
}
OURS = set(ALLOWED) | {"demo", "bench", "experiments", "tests"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, module: str | None = None) -> set[str]:
    """Fully qualified modules `path` (module `module`) imports anywhere in its body, relative imports resolved."""
    module = module or module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            found.add(prefix)
            found.update(f"{prefix}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return found


def package_modules(package: str) -> dict[str, Path]:
    return {module_name(p): p for p in sorted((REPO / package).rglob("*.py"))}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_the_layers_below(package):
    wrong = []
    for path in package_modules(package).values():
        for target in imports_of(path):
            top = target.split(".")[0]
            if top in OURS and top != package and top not in ALLOWED[package]:
                wrong.append(f"{path.relative_to(REPO)} imports {target}")
    assert not wrong, f"{package} may use only {sorted(ALLOWED[package]) or 'no package of ours'}:\n" + "\n".join(wrong)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_import_cycle_inside_a_package(package):
    modules = package_modules(package)
    # `from . import x` names the parent package, which is always initialised before its modules: not an edge
    edges = {
        name: {t for t in imports_of(path) if t in modules and t != name and not name.startswith(t + ".")}
        for name, path in modules.items()
    }
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for name in sorted(modules):
        if name not in state and (cycle := visit(name)):
            pytest.fail(f"import cycle in {package}: {' -> '.join(cycle)}")


def test_the_checker_sees_function_local_and_relative_imports(tmp_path):
    """The two tests above would pass vacuously if imports inside functions, or relative ones, were missed."""
    fake = tmp_path / "m.py"
    fake.write_text("def f():\n    from pretrain import trainer\n    from .tasks import get_task\n", encoding="utf-8")
    found = imports_of(fake, "finetune.m")
    assert {"pretrain.trainer", "finetune.tasks"} <= found


PARSING = ("ArgumentParser(", "add_subparsers(", "add_parser(", "set_defaults(", "parse_args(", "parse_known_args(")


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_command_lines_are_parsed_only_in_main_and_cli_modules(package):
    """Library modules hold no command line: parsers live in `__main__`, `*_cli` and `cli` modules (and
    `common.cli`, the shared helpers), so a library function can be called without argparse in the way."""
    wrong = [
        f"{path.relative_to(REPO)}: {call}"
        for name, path in package_modules(package).items()
        if not (name.endswith(("__main__", "_cli", ".cli")) or name == "common.cli")
        for call in PARSING
        if call in path.read_text(encoding="utf-8")
    ]
    assert not wrong, "argparse parsing outside a CLI module:\n" + "\n".join(wrong)


def test_the_pretrain_trainer_reads_top_down_in_400_lines():
    """Checkpointing (pretrain/checkpointer.py) and evaluation (pretrain/evaluation.py) are components the trainer
    calls; a trainer that grows past this again is taking their work back."""
    lines = (REPO / "pretrain" / "trainer.py").read_text(encoding="utf-8").count("\n")
    assert lines <= 400, f"pretrain/trainer.py has {lines} lines"


def test_a_concept_has_one_home():
    """The run foundation lives in `common` only: no package defines its own run lock, run-directory errors, JSON
    writer or config loader again."""
    shared = ("class RunLock", "class RunDirError", "class RunWriteError", "def atomic_write_json", "def read_object")
    shared += ("class ConfigLayers", "def read_yaml_mapping")
    for package in set(ALLOWED) - {"common"}:
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            assert not [s for s in shared if s in text], f"{path.relative_to(REPO)} defines a concept of common/"
