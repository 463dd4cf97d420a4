"""The ``anabranch`` command, run as users run it (a real subprocess)."""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "research.py"


def anabranch(
    *args: str | bytes,
    cwd: Path | None = None,
    timeout: float = 120,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m anabranch ARGS`` with no Anthropic variables from the developer's shell."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    full["ANTHROPIC_OPEN_TELEMETRY"] = "false"
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), full.get("PYTHONPATH")]))
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "anabranch", *args],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        cwd=cwd or ROOT,
        env=full,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
    )


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def finished_session(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    db = tmp_path_factory.mktemp("cli") / "runs.db"
    done = anabranch(
        "run", f"{EXAMPLE}:supervisor", "Compare SQLite and DuckDB", "--offline", "--db", str(db)
    )
    assert done.returncode == 0, done.stderr
    match = re.search(r"session (ses_[0-9a-f]+)", done.stderr)
    assert match, done.stderr
    return db, match.group(1), done.stdout


def test_run_offline_prints_session_and_output(finished_session: tuple[Path, str, str]) -> None:
    db, session_id, output = finished_session
    assert "Report on: Compare SQLite and DuckDB" in output
    assert stat.S_IMODE(os.stat(db).st_mode) == 0o600


def test_show_prints_the_run_with_token_usage(finished_session: tuple[Path, str, str]) -> None:
    db, session_id, _ = finished_session
    shown = anabranch("show", session_id, "--db", str(db))
    assert shown.returncode == 0, shown.stderr
    assert f"session {session_id}" in shown.stdout
    assert "supervisor [done]" in shown.stdout
    turns = re.search(r"supervisor \[done\] run_\w+\s+turns=(\d+) in=(\d+)", shown.stdout)
    assert turns and int(turns.group(1)) >= 2 and int(turns.group(2)) > 0
    assert re.search(r"total: in=\d+ .* out=\d+", shown.stdout)


def test_sessions_lists_it(finished_session: tuple[Path, str, str]) -> None:
    db, session_id, _ = finished_session
    listed = anabranch("sessions", "--db", str(db))
    assert listed.returncode == 0, listed.stderr
    line = next(line for line in listed.stdout.splitlines() if line.startswith(session_id))
    assert " done " in line and line.rstrip().endswith("supervisor")


def test_resume_of_a_finished_session_prints_its_output(
    finished_session: tuple[Path, str, str],
) -> None:
    db, session_id, output = finished_session
    resumed = anabranch("resume", session_id, "--db", str(db))
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == output


def test_db_from_environment_variable(tmp_path: Path) -> None:
    env_db = tmp_path / "env.db"
    os.environ["ANABRANCH_DB"] = str(env_db)
    try:
        done = anabranch("run", f"{EXAMPLE}:supervisor", "env db", "--offline")
    finally:
        del os.environ["ANABRANCH_DB"]
    assert done.returncode == 0, done.stderr
    assert env_db.exists()


def _one_line_error(result: subprocess.CompletedProcess[str], pattern: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("anabranch: error:")
    assert re.search(pattern, lines[0]), lines[0]


def test_unknown_session_is_a_clear_error(finished_session: tuple[Path, str, str]) -> None:
    db, _, _ = finished_session
    before = _digest(db)
    _one_line_error(anabranch("show", "ses_nope", "--db", str(db)), "no session with id")
    _one_line_error(anabranch("resume", "ses_nope", "--db", str(db)), "no session with id")
    assert _digest(db) == before


def test_missing_database_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    _one_line_error(anabranch("sessions", "--db", str(missing)), "no anabranch database")
    _one_line_error(anabranch("show", "ses_x", "--db", str(missing)), "no anabranch database")
    assert not missing.exists()


def test_foreign_and_corrupt_databases_are_left_alone(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    conn.execute("INSERT INTO invoices (total) VALUES (9.5)")
    conn.commit()
    conn.close()
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not a database at all" * 100)
    for path in (foreign, corrupt):
        before = _digest(path)
        _one_line_error(
            anabranch("run", f"{EXAMPLE}:supervisor", "x", "--offline", "--db", str(path)),
            "not an anabranch database|not a readable SQLite database",
        )
        _one_line_error(anabranch("sessions", "--db", str(path)), "anabranch|SQLite")
        assert _digest(path) == before
        assert not Path(str(path) + "-wal").exists()


def test_bad_targets_write_nothing(tmp_path: Path) -> None:
    db = tmp_path / "never.db"
    _one_line_error(
        anabranch("run", "examples/research.py:nope", "x", "--offline", "--db", str(db)),
        "no object named 'nope'",
    )
    _one_line_error(
        anabranch("run", "missing.py:agent", "x", "--offline", "--db", str(db)), "no Python file"
    )
    _one_line_error(
        anabranch("run", "examples/research.py", "x", "--offline", "--db", str(db)),
        "FILE:OBJECT",
    )
    _one_line_error(
        anabranch("run", "examples/research.py:search_notes", "x", "--offline", "--db", str(db)),
        "not an Agent",
    )
    assert not db.exists()


def test_relative_and_absolute_paths_both_work(tmp_path: Path) -> None:
    db = tmp_path / "paths.db"
    relative = anabranch(
        "run", "examples/research.py:supervisor", "relative", "--offline", "--db", str(db)
    )
    assert relative.returncode == 0, relative.stderr
    absolute = anabranch(
        "run", f"{EXAMPLE}:supervisor", "absolute", "--offline", "--db", str(db), cwd=tmp_path
    )
    assert absolute.returncode == 0, absolute.stderr


def test_offline_uses_the_files_declared_offline_model(tmp_path: Path) -> None:
    """examples/long_task.py declares OFFLINE_MODEL = TestModel(rounds=8): it compacts."""
    db = tmp_path / "long.db"
    done = anabranch(
        "run", "examples/long_task.py:supervisor", "Audit the archive", "--offline", "--db", str(db)
    )
    assert done.returncode == 0, done.stderr
    session_id = re.search(r"session (ses_[0-9a-f]+)", done.stderr)
    assert session_id
    listed = anabranch("compactions", session_id.group(1), "--db", str(db))
    assert listed.returncode == 0, listed.stderr
    rows = [line for line in listed.stdout.splitlines()[1:] if line.strip()]
    agents = {line.split()[1] for line in rows}
    assert len(rows) >= 5 and {"archivist", "analyst"} <= agents
