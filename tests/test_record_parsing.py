"""Stored JSON is turned back into domain objects in one place: ``runtime/_history.py``
(and the store itself). Everything else asks it, so a change of what a field holds (a
reference instead of a copy, a new layout) is made once."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "anabranch"
ALLOWED = ("runtime/_history.py", "store/", "testing/")
"""The history module, the store (it owns its columns) and the test doubles (they parse
wire JSON, not records)."""


def _parses_a_field(call: ast.Call) -> bool:
    """``json.loads(x.field)`` or ``json.loads(x.field or "{}")``."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "loads" and call.args):
        return False
    if not (isinstance(func.value, ast.Name) and func.value.id == "json"):
        return False
    arg = call.args[0]
    if isinstance(arg, ast.BoolOp):
        arg = arg.values[0]
    return isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name)


def _offenders(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(ALLOWED):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and _parses_a_field(node):
                found.append(f"{relative}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_parses_a_record_field_itself() -> None:
    assert _offenders(PACKAGE) == [], "use the parsers of anabranch.runtime._history"


def test_the_check_finds_a_module_that_does(tmp_path: Path) -> None:
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "_x.py").write_text(
        "import json\n"
        "def f(b, e):\n"
        "    json.loads(b.extra)\n"
        "    json.loads(e.content or '{}')\n"
        "    json.loads('[]')\n",
        encoding="utf-8",
    )
    assert [line.split(": ", 1)[1] for line in _offenders(tmp_path)] == [
        "json.loads(b.extra)",
        "json.loads(e.content or '{}')",
    ]
