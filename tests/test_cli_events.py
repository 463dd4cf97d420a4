"""``anabranch run --events`` / progress on stderr / ``--quiet``, as a real subprocess."""

from __future__ import annotations

from pathlib import Path

from anabranch.events import EVENT_ADAPTER, SessionFinished

from .test_cli import EXAMPLE, anabranch


def test_run_events_prints_one_json_event_per_line(tmp_path: Path) -> None:
    db = tmp_path / "e.db"
    done = anabranch(
        "run", f"{EXAMPLE}:supervisor", "events please", "--offline", "--db", str(db), "--events"
    )
    assert done.returncode == 0, done.stderr
    events = [EVENT_ADAPTER.validate_json(line) for line in done.stdout.splitlines()]
    kinds = [e.kind for e in events]
    assert kinds[0] == "session_started" and kinds[-1] == "session_finished"
    assert {"run_started", "child_spawned", "child_reported", "tool_call_finished"} <= set(kinds)
    root = next(e for e in events if e.kind == "run_started" and e.parent_run_id is None)
    children = {e.child_run_id for e in events if e.kind == "child_spawned"}
    assert children and all(e.parent_run_id == root.run_id for e in events if e.run_id in children)
    finished = events[-1]
    assert isinstance(finished, SessionFinished)
    assert finished.status == "done" and "Report on: events please" in finished.output


def test_progress_lines_on_stderr_and_quiet_silences_them(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    loud = anabranch("run", f"{EXAMPLE}:supervisor", "say it", "--offline", "--db", str(db))
    assert loud.returncode == 0, loud.stderr
    lines = loud.stderr.splitlines()
    assert any("] started (depth 0" in line for line in lines), loud.stderr
    assert any("spawned literature_researcher" in line for line in lines), loud.stderr
    assert any("reported (done)" in line for line in lines), loud.stderr
    assert loud.stdout.startswith("Report on: say it")
    quiet = anabranch(
        "run", f"{EXAMPLE}:supervisor", "say it", "--offline", "--db", str(db), "--quiet"
    )
    assert quiet.returncode == 0, quiet.stderr
    assert [line for line in quiet.stderr.splitlines() if not line.startswith("session ")] == []
    assert quiet.stdout.startswith("Report on: say it")
