"""The layering rules of docs/architecture.md, checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "anabranch"

ALLOWED = {
    "agents": {"agents", "errors", "messages"},
    "context": {"context", "agents", "errors", "messages"},
    "store": {"store", "errors", "_process"},
    "traces": {"traces", "context", "errors", "messages"},
}
EXCEPTIONS = {
    # the CLI's SDK configuration finds the Phoenix that `anabranch ui` started
    ("traces", "configure.py", "anabranch.ui._phoenix"),
}
IO_MODULES = {"sqlite3", "sqlite_utils", "socket", "subprocess", "httpx2", "anthropic", "anyio"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_what_they_may(package: str) -> None:
    offenders = []
    for path in sorted((SRC / package).rglob("*.py")):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] != "anabranch" or len(parts) < 2:
                continue
            if parts[1] not in ALLOWED[package] and (package, path.name, name) not in EXCEPTIONS:
                offenders.append(f"{path.name} imports {name}")
    assert not offenders, offenders


@pytest.mark.parametrize("package", ["agents", "context"])
def test_pure_packages_do_no_io(package: str) -> None:
    offenders = [
        f"{path.name} imports {name}"
        for path in sorted((SRC / package).glob("*.py"))
        for name in _imports(path)
        if name.split(".")[0] in IO_MODULES
    ]
    assert not offenders, offenders
