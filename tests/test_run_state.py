"""Nothing outside the loop assigns run state (issue 12: value-returning seams).

"The loop" is the set of modules that define ``AgentRun`` and its bases. Everywhere else in
``src/anabranch`` a run (a name typed ``AgentRun``, or bound from ``AgentRun(...)``,
``AgentRun.start/load`` or a function returning one) may be read and driven through the
loop's doors (``drive``, ``continue_with``, ``pipeline_step``), never assigned to or
changed through one of its mutators. The context pipeline does not even import the loop:
it reads a ``ContextView`` and returns a ``ContextChange``.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from anabranch.runtime._loop import AgentRun

SRC = Path(__file__).resolve().parents[1] / "src" / "anabranch"

DOORS = frozenset({"drive", "continue_with", "pipeline_step", "start", "load"})
"""The loop's entry points a driver calls (each changes the run only inside the loop)."""

PIPELINE_MODULES = (
    "runtime/_pipeline.py",
    "runtime/_ahead.py",
    "runtime/_model_switch.py",
    "runtime/_compactor.py",
    "runtime/_compaction_step.py",
    "runtime/_context_view.py",
    "runtime/_breaker.py",
    "runtime/_head.py",
    "runtime/_limits.py",
    "runtime/_summarizer.py",
    "runtime/_quiet_call.py",
)


def _loop_files() -> set[Path]:
    return {
        Path(inspect.getfile(cls)).resolve()
        for cls in AgentRun.__mro__
        if cls.__module__.startswith("anabranch.")
    }


def _mutators() -> set[str]:
    """Methods of the loop's classes that assign an attribute of ``self``, or call one
    that does (``rebuild_snapshot`` through ``save_snapshot``)."""
    methods = [  # every definition (a base may declare a stub the loop overrides)
        (node.name, node)
        for path in _loop_files()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    found = {
        name
        for name, node in methods
        if any(_is_name(t.value, "self") for inner in ast.walk(node) for t in _store_targets(inner))
    }
    while True:
        more = {
            name
            for name, node in methods
            for inner in ast.walk(node)
            if isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Attribute)
            and _is_name(inner.func.value, "self")
            and inner.func.attr in found
        } - found
        if not more:
            return found - DOORS - {"__init__"}
        found |= more


def _store_targets(node: ast.AST) -> list[ast.Attribute]:
    if isinstance(node, ast.Assign):
        candidates = [t for target in node.targets for t in _flatten(target)]
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        candidates = [node.target]
    elif isinstance(node, ast.Delete):
        candidates = list(node.targets)
    else:
        return []
    return [c for c in candidates if isinstance(c, ast.Attribute)]


def _flatten(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        return [t for element in target.elts for t in _flatten(element)]
    return [target]


def _is_name(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _mentions_run(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return "AgentRun" in annotation.value
    return any(_is_name(n, "AgentRun") for n in ast.walk(annotation) if isinstance(n, ast.Name))


def _run_factories(trees: dict[Path, ast.Module]) -> set[str]:
    """Functions (anywhere in src) annotated to return an ``AgentRun``."""
    return {
        node.name
        for tree in trees.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _mentions_run(node.returns)
    }


def _makes_run(value: ast.expr | None, factories: set[str]) -> bool:
    if isinstance(value, ast.Await):
        value = value.value
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    if _is_name(func, "AgentRun") or (
        isinstance(func, ast.Attribute) and _is_name(func.value, "AgentRun")
    ):
        return True
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in factories


def _runs_in(function: ast.FunctionDef | ast.AsyncFunctionDef, factories: set[str]) -> set[str]:
    """Names in ``function`` that hold an ``AgentRun``."""
    args = function.args
    runs = {
        a.arg
        for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)
        if _mentions_run(a.annotation)
    }
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and _makes_run(node.value, factories):
            runs |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if _mentions_run(node.annotation) or _makes_run(node.value, factories):
                runs.add(node.target.id)
        if isinstance(node, ast.Call) and _is_name(node.func, "isinstance"):
            first, *rest = node.args
            if isinstance(first, ast.Name) and rest and _mentions_run(rest[0]):
                runs.add(first.id)
    return runs


def _changed_by_call(node: ast.Call, runs: set[str], mutators: set[str]) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        if func.value.id in runs and func.attr in mutators:
            return f"calls {func.value.id}.{func.attr}()"
    if _is_name(func, "setattr") and node.args:
        first = node.args[0]
        if isinstance(first, ast.Name) and first.id in runs:
            return f"setattr on {first.id}"
    return None


def violations(tree: ast.Module, factories: set[str], mutators: set[str]) -> list[str]:
    """Where ``tree`` assigns run state, as ``line: what``."""
    found: list[str] = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        runs = _runs_in(function, factories)
        for node in ast.walk(function):
            if isinstance(node, ast.stmt):
                for target in _store_targets(node):
                    if isinstance(target.value, ast.Name) and target.value.id in runs:
                        found.append(f"{node.lineno}: assigns {target.value.id}.{target.attr}")
            if isinstance(node, ast.Call):
                change = _changed_by_call(node, runs, mutators)
                if change is not None:
                    found.append(f"{node.lineno}: {change}")
    return found


def _trees() -> dict[Path, ast.Module]:
    return {path.resolve(): ast.parse(path.read_text()) for path in SRC.rglob("*.py")}


def test_the_loop_has_mutators_to_protect() -> None:
    mutators = _mutators()
    # the check is only as good as this set: the loop's own state changers are in it
    assert {"append", "save_snapshot", "rebuild_snapshot", "take_turn"} <= mutators


def test_nothing_outside_the_loop_assigns_run_state() -> None:
    trees = _trees()
    factories = _run_factories(trees)
    mutators = _mutators()
    loop = _loop_files()
    problems = [
        f"{path.relative_to(SRC)}:{where}"
        for path, tree in sorted(trees.items())
        if path not in loop
        for where in violations(tree, factories, mutators)
    ]
    assert problems == [], "run state changed outside the loop:\n" + "\n".join(problems)


def test_the_check_catches_each_kind_of_change() -> None:
    """The checker itself: every way of changing a run outside the loop is reported."""
    source = """
async def a(run: AgentRun) -> None:
    run.next_seq = 3
async def b(env) -> None:
    run = await AgentRun.load(env, agent, record)
    run.context += []
async def c(env) -> None:
    child = await open_child(env)
    await child.append()
async def d(view) -> None:
    assert isinstance(view, AgentRun)
    setattr(view, "turns", 0)
async def e(run: "AgentRun | None") -> None:
    run.compactions, x = 1, 2
async def fine(run: AgentRun, other) -> None:
    other.next_seq = 1
    await run.drive()
    await run.pipeline_step(step)
"""
    found = violations(ast.parse(source), {"open_child"}, _mutators())
    assert found == [
        "3: assigns run.next_seq",
        "6: assigns run.context",
        "9: calls child.append()",
        "12: setattr on view",
        "14: assigns run.compactions",
    ]


def test_the_context_pipeline_does_not_import_the_loop() -> None:
    """The pipeline sees a ``ContextView`` and nothing else of the run."""
    loop_modules = {
        cls.__module__ for cls in AgentRun.__mro__ if cls.__module__.startswith("anabranch.")
    }
    for name in PIPELINE_MODULES:
        tree = ast.parse((SRC / name).read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)} | {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        }
        assert not imported & loop_modules, f"{name} imports {imported & loop_modules}"
