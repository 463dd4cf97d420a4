"""Resume from the command line: listing unfinished sessions, and refusing bad input
(unknown id, a newer schema, a corrupt file) with one clear line and nothing modified."""

from __future__ import annotations

import hashlib
import shlex
import shutil
import sqlite3
from pathlib import Path

import anyio
import pytest

from anabranch import Agent, Runtime
from anabranch.cli import main
from anabranch.errors import DatabaseError, SessionNotFoundError
from anabranch.messages import ModelRequest
from anabranch.testing import FunctionModel

AGENT_FILE = """
from anabranch import Agent
agent = Agent(name="helper", instructions="Answer briefly.")
"""


def dir_state(folder: Path) -> dict[str, tuple[int, int, str] | None]:
    """Every file in ``folder``: size, mtime and content hash.

    A ``-shm`` file only counts by its presence: it is SQLite's shared-memory index of
    the WAL, which any reader may rebuild; it holds no data.
    """
    return {
        p.name: None
        if p.name.endswith("-shm")
        else (p.stat().st_size, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(folder.iterdir())
    }


def make_session(db: Path, *, finish: bool, source: str | None = None) -> str:
    """A session in ``db``: finished, or stopped while its first request was in flight."""
    agent = Agent(name="helper", instructions="Answer briefly.")
    reached = anyio.Event()

    async def respond(request: ModelRequest) -> str:
        if not finish:
            reached.set()
            await anyio.sleep_forever()
        return "done"

    async def go() -> str:
        ids: list[str] = []
        async with Runtime(db=db, model=FunctionModel(respond)) as rt:
            if finish:
                return (await rt.run(agent, "task", source=source)).session_id
            async with anyio.create_task_group() as group:

                async def run() -> None:
                    await rt.run(agent, "task", source=source, on_session=ids.append)

                group.start_soon(run)
                await reached.wait()
                group.cancel_scope.cancel()
        return ids[0]

    return anyio.run(go)


def test_sessions_lists_unfinished_sessions_with_their_resume_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "my runs"
    folder.mkdir()
    db = folder / "s.db"
    agent_file = tmp_path / "agent.py"
    agent_file.write_text(AGENT_FILE)
    done = make_session(db, finish=True)
    stopped = make_session(db, finish=False, source=f"{agent_file}:agent")

    assert main(["sessions", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("ses_")}
    assert lines[done].split()[1] == "done"
    assert lines[stopped].split()[1] == "interrupted"
    commands = [line.strip() for line in out.splitlines() if "anabranch resume" in line]
    assert commands == [f"anabranch resume {stopped} --db {shlex.quote(str(db))}"]

    # The printed command works as printed (run offline here: no API in tests).
    argv = shlex.split(commands[0])
    assert argv[:2] == ["anabranch", "resume"]
    assert main([*argv[1:], "--offline"]) == 0
    assert "Report on: task" in capsys.readouterr().out
    assert main(["sessions", "--db", str(db)]) == 0
    assert "anabranch resume" not in capsys.readouterr().out


def _set_schema_version(db: Path, version: str) -> sqlite3.Connection:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (version,))
    return conn


def _newer_schema(db: Path) -> None:
    make_session(db, finish=True)
    _set_schema_version(db, "99").close()


def _newer_schema_with_wal(db: Path) -> None:
    """As a newer anabranch killed mid-write leaves it: the last commits only in the WAL."""
    make_session(db, finish=True)
    conn = _set_schema_version(db, "99")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    for suffix in ("wal", "shm"):
        shutil.copy(f"{db}-{suffix}", f"{db}.keep-{suffix}")
    conn.close()
    for suffix in ("wal", "shm"):
        shutil.move(f"{db}.keep-{suffix}", f"{db}-{suffix}")
    assert Path(f"{db}-wal").stat().st_size > 0


def _garbage(db: Path) -> None:
    db.write_bytes(b"this is not a database, just some notes\n" * 200)


def _damaged_pages(db: Path) -> None:
    make_session(db, finish=True)
    make_session(db, finish=True)
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode=DELETE")
    data = bytearray(db.read_bytes())
    page = 4096
    for start in range(2 * page, len(data), page):  # every page after the first
        data[start : start + 64] = b"\xff" * 64
    db.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("prepare", "message"),
    [
        (_newer_schema, "newer than this anabranch"),
        (_newer_schema_with_wal, "newer than this anabranch"),
        (_garbage, "not a readable SQLite database"),
        (_damaged_pages, "corrupt"),
    ],
    ids=["newer-schema", "newer-schema-wal", "not-sqlite", "damaged"],
)
def test_unusable_database_is_refused_and_left_untouched(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    prepare: object,
    message: str,
) -> None:
    db = tmp_path / "s.db"
    prepare(db)  # type: ignore[operator]
    before = dir_state(tmp_path)

    for argv in (["resume", "ses_0123456789abcdef"], ["sessions"], ["show", "ses_0"]):
        assert main([*argv, "--db", str(db)]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("anabranch: error:") and message in err
        assert "\n" not in err

    async def library() -> None:
        with pytest.raises(DatabaseError, match=message):
            async with Runtime(db=db) as rt:
                await rt.resume("ses_0123456789abcdef")

    anyio.run(library)
    assert dir_state(tmp_path) == before


def test_unknown_session_id_is_refused_and_nothing_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.db"
    make_session(db, finish=True)
    sqlite3.connect(db).close()
    before = dir_state(tmp_path)

    assert main(["resume", "ses_feedfacefeedface", "--db", str(db)]) == 1
    err = capsys.readouterr().err
    assert "no session with id 'ses_feedfacefeedface'" in err

    async def library() -> None:
        async with Runtime(db=db) as rt:
            with pytest.raises(SessionNotFoundError):
                await rt.resume("ses_feedfacefeedface")

    anyio.run(library)
    assert dir_state(tmp_path) == before


def test_resume_without_a_database_creates_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "missing.db"
    assert main(["resume", "ses_0123456789abcdef", "--db", str(db)]) == 1
    assert "no anabranch database" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
