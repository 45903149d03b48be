"""The import rules of ARCHITECTURE.md, checked by parsing every module with ``ast``."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("igpolicy", "traces", "igsim", "igrt", "igplot")

# package -> top-level modules it must never import (directly or via `from x import`)
FORBIDDEN: dict[str, frozenset[str]] = {
    "igpolicy": frozenset({"torch", "simpy", "networkx", "pyarrow", "igsim", "igrt", "traces", "pandas"}),
    "traces": frozenset({"torch", "igsim", "igrt", "simpy", "networkx"}),
    "igsim": frozenset({"torch", "igrt"}),
    "igrt": frozenset({"igsim", "simpy", "networkx"}),
    "igplot": frozenset({"torch", "igsim", "igrt", "traces", "simpy", "networkx", "pyarrow"}),
}
# package -> third-party top-level modules it may import (stdlib is always allowed)
ALLOWED_THIRD_PARTY: dict[str, frozenset[str]] = {
    "igpolicy": frozenset({"numpy", "scipy"}),
    "traces": frozenset({"igpolicy", "pyarrow", "numpy"}),
    "igsim": frozenset(
        {"igpolicy", "traces", "igplot", "simpy", "networkx", "numpy", "scipy", "matplotlib", "tqdm", "yaml", "ray"}
    ),
    "igrt": frozenset(
        {"igpolicy", "traces", "igplot", "torch", "numpy", "tqdm", "transformers", "deepspeed", "yaml"}
    ),
    "igplot": frozenset({"numpy", "matplotlib", "igpolicy"}),
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, top-level module) for every import in ``path``; relative imports are skipped."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name.split(".")[0]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def violations(package_dir: Path, package: str) -> list[str]:
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    problems = []
    for path in sorted(package_dir.rglob("*.py")):
        for line, mod in imported_modules(path):
            if mod == package or mod in stdlib:
                continue
            where = f"{path.relative_to(package_dir.parent)}:{line}"
            if mod in FORBIDDEN[package]:
                problems.append(f"{where}: {package} must never import {mod}")
            elif mod not in ALLOWED_THIRD_PARTY[package]:
                problems.append(f"{where}: {package} imports {mod}, which is not in its allowed list")
    return problems


@pytest.mark.parametrize("package", PACKAGES)
def test_import_rules(package: str) -> None:
    assert (ROOT / package).is_dir(), f"package folder {package}/ is missing"
    assert violations(ROOT / package, package) == []


def test_checker_catches_a_broken_rule(tmp_path: Path) -> None:
    """The checker itself must fail on a forbidden import (so the test above can fail)."""
    pkg = tmp_path / "igpolicy"
    pkg.mkdir()
    (pkg / "bad.py").write_text("import numpy\nfrom torch import nn\n\ndef f():\n    import simpy\n")
    found = violations(pkg, "igpolicy")
    assert any("must never import torch" in v for v in found)
    assert any("must never import simpy" in v for v in found)
    assert not any("numpy" in v for v in found)


def _full_imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


@pytest.mark.parametrize("package", ("igsim", "igrt"))
def test_cli_modules_import_the_library_never_each_other(package: str) -> None:
    """``<pkg>/cli/*`` may import the library and ``<pkg>.cli.options``; no library module imports the
    CLI, and experiments use only its entry point (``<pkg>.cli.main``), never a command module."""
    cli = f"{package}.cli"
    problems = []
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT)
        in_cli = rel.parts[1] == "cli" or rel.name == "__main__.py"
        for line, mod in _full_imports(path):
            if not (mod == cli or mod.startswith(cli + ".")):
                continue
            if in_cli and mod in (cli, f"{cli}.options"):
                continue
            problems.append(f"{rel}:{line}: imports {mod}")
    for path in sorted((ROOT / "experiments").rglob("*.py")):
        problems += [f"{path.relative_to(ROOT)}:{ln}: imports {m}" for ln, m in _full_imports(path) if m.startswith(cli + ".")]
    assert not problems, "\n".join(problems)
