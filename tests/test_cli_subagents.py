"""The shipped examples run offline from the CLI, and `show` prints their run trees."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from anabranch.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _session_id(stderr: str) -> str:
    match = re.search(r"session (ses_\w+)", stderr)
    assert match, stderr
    return match.group(1)


def test_research_example_runs_offline_and_shows_its_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "r.db")
    target = f"{EXAMPLES / 'research.py'}:supervisor"
    assert main(["run", target, "Compare SQLite and DuckDB", "--offline", "--db", db]) == 0
    out, err = capsys.readouterr()
    session_id = _session_id(err)
    assert "report of sub-agent literature_researcher" in out
    assert "report of sub-agent benchmark_researcher" in out

    assert main(["show", session_id, "--db", db]) == 0
    tree = capsys.readouterr().out.splitlines()
    root = next(i for i, line in enumerate(tree) if line.startswith("supervisor [done]"))
    children = tree[root + 1 : root + 3]
    assert children[0].startswith("├─ ") and children[1].startswith("└─ ")
    assert {c.split()[1] for c in children} == {"literature_researcher", "benchmark_researcher"}
    assert all("[done]" in c and "turns=2" in c and "compactions=0" in c for c in children)


def test_graph_example_runs_offline_shows_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "g.db")
    target = f"{EXAMPLES / 'graph.py'}:graph"
    assert main(["run", target, "--offline", "--db", db]) == 0
    out, err = capsys.readouterr()
    session_id = _session_id(err)
    assert "Report on: Answer the question" in out

    assert main(["show", session_id, "--db", db]) == 0
    shown = capsys.readouterr().out
    for task, agent in [
        ("plan", "planner"),
        ("sqlite", "sqlite_researcher"),
        ("duckdb", "duckdb_researcher"),
        ("synthesis", "writer"),
    ]:
        assert re.search(rf"^{task}: {agent} \[done\] run_\w+ +turns=\d", shown, re.M), shown

    assert main(["resume", session_id, "--db", db, "--offline"]) == 0
    assert capsys.readouterr().out == out


def test_run_checks_the_task_argument_against_the_definition(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "e.db")
    assert main(["run", f"{EXAMPLES / 'graph.py'}:graph", "a task", "--db", db]) == 1
    assert "is a Graph" in capsys.readouterr().err
    assert main(["run", f"{EXAMPLES / 'research.py'}:supervisor", "--db", db]) == 1
    assert "give it a TASK" in capsys.readouterr().err
    assert main(["run", f"{EXAMPLES / 'graph.py'}:QUESTION", "--db", db]) == 1
    assert "not an Agent or a Graph" in capsys.readouterr().err


FAILING_GRAPH = '''
from anabranch import Agent, Graph, Task, tool

@tool
def poke() -> str:
    """Poke."""
    return "poked"

flaky = Agent(name="flaky", tools=[poke], max_turns=1, on_limit="fail")  # needs a 2nd turn
steady = Agent(name="steady")
graph = Graph(
    name="breaks",
    tasks=[
        Task(id="first", agent=flaky, prompt="poke it"),
        Task(id="second", agent=steady, prompt="use it", depends_on=["first"]),
        Task(id="side", agent=steady, prompt="on the side"),
    ],
)
'''


def test_a_failed_graph_exits_non_zero_and_show_lists_tasks_never_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "breaks.py"
    source.write_text(FAILING_GRAPH)
    db = str(tmp_path / "b.db")
    assert main(["run", f"{source}:graph", "--offline", "--db", db]) == 1
    _, err = capsys.readouterr()
    assert "breaks failed in session" in err and "max_turns=1" in err
    assert main(["show", _session_id(err), "--db", db]) == 0
    shown = capsys.readouterr().out
    assert "status=failed" in shown
    assert re.search(r"^first: flaky \[failed\]", shown, re.M)
    assert re.search(r"^side: steady \[done\]", shown, re.M)
    # labelled as GraphResult reports it (before: "[not run]", where the API says failed)
    assert re.search(r"^second: steady \[failed: not run, dependency 'first' failed\]", shown, re.M)
