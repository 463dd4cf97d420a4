"""The database file under other processes and loose permissions, through the real command
(subprocesses, each with a deadline): concurrent creation, a stopped lock holder, read-only
inspection that never writes, owner-only modes."""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import sqlite_utils

from anabranch.store.sqlite._schema import APP_ID, MIGRATIONS

from .test_cli import EXAMPLE, ROOT, anabranch

AGENT = f"{EXAMPLE}:supervisor"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    return env


# Each process imports everything first, then waits for the start file, so all of them
# open the new database at the same moment (not staggered by interpreter start-up).
AT_ONCE = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import anabranch.cli._run, anabranch.store, anabranch.runtime._runtime, anabranch.testing
    from anabranch.cli import main
    go = Path(sys.argv[1])
    Path(sys.argv[2]).touch()
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    sys.exit(main(sys.argv[3:]))
    """
)


def test_several_processes_creating_one_new_database_all_succeed(tmp_path: Path) -> None:
    """Before: some died with ``table "meta" already exists`` (the schema creation raced)."""
    db = tmp_path / "new.db"
    go = tmp_path / "go"
    count = 6
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                AT_ONCE,
                str(go),
                str(tmp_path / f"ready{i}"),
                "run",
                AGENT,
                f"task {i}",
                "--offline",
                "--db",
                str(db),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )  # fmt: skip
        for i in range(count)
    ]
    try:
        deadline = time.monotonic() + 90
        while not all((tmp_path / f"ready{i}").exists() for i in range(count)):
            assert time.monotonic() < deadline, "the processes did not start"
            assert all(p.poll() is None for p in processes), [p.communicate() for p in processes]
            time.sleep(0.01)
        go.touch()
        results = [p.communicate(timeout=120) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    failures = [err for p, (_, err) in zip(processes, results, strict=True) if p.returncode]
    assert not failures, failures[0]
    listed = anabranch("sessions", "--db", str(db))
    assert listed.stdout.count(" done ") == count, listed.stdout


LOCK_HOLDER = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO meta(key, value) VALUES ('held', 'yes')")
    print("holding", flush=True)
    sys.stdin.read()
    """
)


def test_a_stopped_process_holding_the_write_lock_is_one_line_after_a_bounded_wait(
    tmp_path: Path,
) -> None:
    """Before: a 30 s wait, then a raw ``database is locked`` traceback."""
    db = tmp_path / "runs.db"
    assert anabranch("run", AGENT, "first", "--offline", "--db", str(db)).returncode == 0
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(db)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        holder.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        done = anabranch(
            "run", AGENT, "second", "--offline", "--db", str(db),
            env={"ANABRANCH_LOCK_TIMEOUT": "1"}, timeout=60,
        )  # fmt: skip
        waited = time.monotonic() - started
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait(timeout=10)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "locked" in lines[0] and "write lock for over 1 s" in lines[0], lines[0]
    assert waited < 50
    listed = anabranch("sessions", "--db", str(db))
    assert listed.returncode == 0 and "interrupted" not in listed.stdout, listed.stdout


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _older_database(path: Path, version: int) -> None:
    """A database as the anabranch of schema ``version`` left it (no sessions)."""
    db = sqlite_utils.Database(path)
    for step in MIGRATIONS[:version]:
        step(db)
    db.execute(
        "INSERT OR REPLACE INTO meta(key, value) VALUES ('app', ?), ('schema_version', ?)",
        [APP_ID, str(version)],
    )
    db.conn.commit()
    db.close()


@pytest.mark.parametrize("command", [["sessions"], ["show", "ses_0"], ["compactions", "ses_0"]])
def test_read_only_commands_never_migrate_an_older_database(
    tmp_path: Path, command: list[str]
) -> None:
    """Before: ``sessions`` silently migrated it, and the older anabranch then refused it."""
    db = tmp_path / "old.db"
    _older_database(db, len(MIGRATIONS) - 1)
    before = _digest(db)
    done = anabranch(*command, "--db", str(db))
    assert "Traceback" not in done.stderr
    assert done.returncode in (0, 1), done.stderr
    if command == ["sessions"]:
        assert done.stdout.strip() == "no sessions", done.stdout
    assert _digest(db) == before
    with sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True) as conn:
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert version == (str(len(MIGRATIONS) - 1),)


def test_read_only_commands_write_nothing(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    made = anabranch("run", AGENT, "task", "--offline", "--db", str(db))
    session_id = made.stderr.split()[1]
    os.chmod(db, 0o640)  # a loose mode a writer would fix; a reader leaves it
    before = (_digest(db), db.stat().st_mtime_ns)
    for command in (["sessions"], ["show", session_id], ["compactions", session_id]):
        done = anabranch(*command, "--db", str(db))
        assert done.returncode == 0, done.stderr
    assert (_digest(db), db.stat().st_mtime_ns) == before
    assert stat.S_IMODE(db.stat().st_mode) == 0o640


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write a read-only file")
def test_a_database_you_cannot_write_can_be_inspected(tmp_path: Path) -> None:
    """Before: ``attempt to write a readonly database``."""
    db = tmp_path / "runs.db"
    made = anabranch("run", AGENT, "task", "--offline", "--db", str(db))
    session_id = made.stderr.split()[1]
    os.chmod(db, 0o400)
    shown = anabranch("show", session_id, "--db", str(db))
    assert shown.returncode == 0 and f"session {session_id}" in shown.stdout, shown.stderr


def test_an_existing_file_with_a_loose_mode_is_made_owner_only(tmp_path: Path) -> None:
    """Before: a database created with ``touch`` (0644) kept its mode, and so did the
    ``-wal``/``-shm`` files next to it."""
    db = tmp_path / "runs.db"
    db.touch(mode=0o644)
    os.chmod(db, 0o644)
    done = anabranch("run", AGENT, "task", "--offline", "--db", str(db))
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    for suffix in ("-wal", "-shm"):
        loose = Path(f"{db}{suffix}")
        loose.touch()
        os.chmod(loose, 0o666)
    os.chmod(db, 0o664)
    again = anabranch("run", AGENT, "again", "--offline", "--db", str(db))
    assert again.returncode == 0, again.stderr
    for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        if path.exists():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_delete_and_prune_remove_whole_sessions_and_keep_the_rest_intact(tmp_path: Path) -> None:
    """Before: no way to remove a session (every failed start left one behind)."""
    db = tmp_path / "runs.db"
    ids = []
    for task in ("first task", "second task", "third task"):
        made = anabranch("run", AGENT, task, "--offline", "--db", str(db))
        assert made.returncode == 0, made.stderr
        ids.append(made.stderr.split()[1])
    deleted = anabranch("delete", ids[0], "--db", str(db))
    assert deleted.returncode == 0 and f"deleted {ids[0]}" in deleted.stdout, deleted.stderr
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO history_fts(history_fts) VALUES ('integrity-check')")
        conn.execute("INSERT INTO history_spill_fts(history_spill_fts) VALUES ('integrity-check')")
        left = {
            table: conn.execute(
                f"SELECT count(*) FROM {table} WHERE run_id IN "
                "(SELECT id FROM runs WHERE session_id = ?)",
                (ids[0],),
            ).fetchone()[0]
            for table in ("messages", "calls", "snapshots", "tool_events")
        }
        runs = conn.execute("SELECT count(*) FROM runs WHERE session_id = ?", (ids[0],)).fetchone()
        orphans = conn.execute(
            "SELECT count(*) FROM messages WHERE run_id NOT IN (SELECT id FROM runs)"
        ).fetchone()
    assert left == dict.fromkeys(left, 0) and runs == (0,) and orphans == (0,)
    missing = anabranch("delete", ids[0], "--db", str(db))
    assert missing.returncode == 1 and "no session" in missing.stderr
    dry = anabranch("prune", "--status", "done", "--dry-run", "--db", str(db))
    assert dry.stdout.count("would delete") == 2
    pruned = anabranch("prune", "--status", "done", "--older-than", "0", "--db", str(db))
    assert pruned.stdout.count("deleted") == 2, pruned.stdout
    listed = anabranch("sessions", "--db", str(db))
    assert listed.stdout.strip() == "no sessions"
    vague = anabranch("prune", "--db", str(db))
    assert vague.returncode == 1 and "say what to prune" in vague.stderr
