"""What is particular to the PostgreSQL store: DSN secrecy, append-only tables, fencing
across store instances (processes), schema checks, and ``anabranch migrate``."""

from __future__ import annotations

import contextlib
import io
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import anyio
import psycopg
import pytest

from anabranch import Agent, Runtime, tool
from anabranch.cli import main
from anabranch.errors import DatabaseError, LeaseLostError, SessionBusyError
from anabranch.store import (
    MessageRecord,
    PostgresStore,
    RunRecord,
    SessionRecord,
    open_store,
    redact_dsn,
)
from anabranch.testing import TestModel
from tests.databases import rows, table_names


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def anabranch(*args: str) -> Done:
    """The ``anabranch`` command, in this process (a subprocess costs seconds to import)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return Done(code, out.getvalue(), err.getvalue())


def password(dsn: str) -> str:
    secret = urllib.parse.urlsplit(dsn).password
    assert secret
    return secret


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


async def run_one(db: str, task: str = "look up alpha") -> str:
    agent = Agent(name="looker", tools=[lookup])
    async with Runtime(db=db, model=TestModel()) as rt:
        result = await rt.run(agent, task)
    return result.session_id


async def cut_session(db: str) -> None:
    """A session whose process died before its first run (no lease, not finished)."""
    async with Runtime(db=db) as rt:
        assert password(db) not in repr(rt.store)
        await rt.store.create_session(
            SessionRecord(id="ses_cut", created=time.time(), kind="agent", entry="looker", task="t")
        )


def test_the_password_is_nowhere(postgres_dsn: str, tmp_path: Path) -> None:
    secret = password(postgres_dsn)
    rt = Runtime(db=postgres_dsn)
    assert secret not in rt.db
    session_id = anyio.run(run_one, postgres_dsn)
    for table in table_names(postgres_dsn):
        dump = str(rows(postgres_dsn, f"SELECT * FROM {table}"))
        assert secret not in dump, table
    # an interrupted session: `sessions` prints a resume command without the password
    anyio.run(cut_session, postgres_dsn)
    listed = anabranch("sessions", "--db", postgres_dsn)
    assert listed.returncode == 0, listed.stderr
    assert session_id in listed.stdout and secret not in listed.stdout + listed.stderr
    expected = postgres_dsn.replace(f":{secret}@", "@")
    assert f"anabranch resume ses_cut --db {expected}" in listed.stdout
    # a wrong password: a one-line error that does not echo it
    wrong = postgres_dsn.replace(secret, "not-the-password-xyz")
    shown = anabranch("show", session_id, "--db", wrong)
    assert shown.returncode == 1
    assert "not-the-password-xyz" not in shown.stderr and secret not in shown.stderr
    assert shown.stderr.startswith("anabranch: error: cannot connect to postgresql://postgres:***@")
    assert redact_dsn(postgres_dsn) in anabranch("show", "nope", "--db", postgres_dsn).stderr


@pytest.mark.anyio
async def test_history_tables_are_append_only(postgres_dsn: str) -> None:
    await run_one(postgres_dsn)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for statement in (
            "UPDATE anabranch.messages SET content = '[]'",
            "DELETE FROM anabranch.calls",
            "TRUNCATE anabranch.tool_events",
        ):
            with pytest.raises(psycopg.errors.IntegrityConstraintViolation, match="append-only"):
                conn.execute(statement)


@pytest.mark.anyio
async def test_a_stalled_store_is_fenced_after_a_takeover(postgres_dsn: str) -> None:
    """Two stores are two processes. After B takes over A's expired lease, every write A
    makes for that session raises LeaseLostError and commits nothing."""
    a = await PostgresStore.open(postgres_dsn)
    b = await PostgresStore.open(postgres_dsn)
    try:
        await a.create_session(
            SessionRecord(id="ses_f", created=time.time(), kind="agent", entry="x", task="t")
        )
        await a.acquire_lease("ses_f", "host-a:1", ttl=30)
        await a.create_run(
            RunRecord(
                id="run_f", session_id="ses_f", agent_name="x", model="m", created=time.time()
            ),
            messages=[MessageRecord(run_id="run_f", seq=0, role="user", content="[]")],
        )
        with pytest.raises(SessionBusyError):
            await b.acquire_lease("ses_f", "host-b:2", ttl=30)
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:  # A stalls past its ttl
            conn.execute("UPDATE anabranch.leases SET expires = 0")
        await b.acquire_lease("ses_f", "host-b:2", ttl=30)
        with pytest.raises(LeaseLostError):
            await a.append_messages(
                [MessageRecord(run_id="run_f", seq=1, role="assistant", content="[]")]
            )
        with pytest.raises(LeaseLostError):  # and it stays fenced, even after a release
            await a.release_lease("ses_f", "host-a:1")
            await a.set_session_status("ses_f", "failed", error="stale")
        assert not await a.renew_lease("ses_f", "host-a:1", ttl=30)
        await b.append_messages(
            [MessageRecord(run_id="run_f", seq=1, role="assistant", content="[]")]
        )
        assert [m.seq for m in await b.load_messages("run_f")] == [0, 1]
        assert (await b.get_session("ses_f")).status == "running"  # type: ignore[union-attr]
        assert await b.lease_holder("ses_f") == "host-b:2"
    finally:
        await a.close()
        await b.close()


class _HeldWatch(dict[str, str]):
    """A store's held leases that note, at every removal, whether the session was already
    recorded lost: a fence read on another thread between the two finds it in neither, and
    then the write it guards goes through unfenced."""

    def __init__(self, lost: set[str]) -> None:
        super().__init__()
        self.lost = lost
        self.unguarded: list[str] = []

    def pop(self, key: str, *default: str | None) -> str | None:  # type: ignore[override]
        if key in self and key not in self.lost:
            self.unguarded.append(key)
        return super().pop(key, *default)

    def __delitem__(self, key: str) -> None:
        if key not in self.lost:
            self.unguarded.append(key)
        super().__delitem__(key)


@pytest.mark.anyio
@pytest.mark.parametrize("found_by", ["renewal", "fenced write", "release"])
async def test_a_lost_lease_is_recorded_lost_before_it_stops_being_held(
    postgres_dsn: str, found_by: str
) -> None:
    """However a store finds out that its lease was taken over, at no moment is the session
    neither held nor lost: the fence of a concurrent write always has something to check."""
    a = await PostgresStore.open(postgres_dsn)
    b = await PostgresStore.open(postgres_dsn)
    try:
        await a.create_session(
            SessionRecord(id="ses_w", created=time.time(), kind="agent", entry="x", task="t")
        )
        await a.acquire_lease("ses_w", "host-a:1", ttl=-1.0)  # already expired
        await b.acquire_lease("ses_w", "host-b:2", ttl=30)
        watch = _HeldWatch(a._lost)
        watch.update(a._held)
        a._held = watch
        if found_by == "renewal":
            assert not await a.renew_lease("ses_w", "host-a:1", ttl=30)
        elif found_by == "fenced write":
            with pytest.raises(LeaseLostError):
                await a.set_session_status("ses_w", "failed", error="stale")
        else:
            with pytest.raises(LeaseLostError):
                await a.release_lease("ses_w", "host-a:1", status="failed", error="stale")
        assert "ses_w" in a._lost and "ses_w" not in a._held
        assert watch.unguarded == []
        with pytest.raises(LeaseLostError):  # and every later write is refused
            await a.set_session_status("ses_w", "failed", error="stale")
        assert (await b.get_session("ses_w")).status == "running"  # type: ignore[union-attr]
    finally:
        await a.close()
        await b.close()


@pytest.mark.anyio
async def test_a_fenced_write_fails_alone_in_its_batch(postgres_dsn: str) -> None:
    """Writes for many leased sessions share one (pipelined) transaction. When one of
    those sessions was taken over, its write raises LeaseLostError and commits nothing;
    the writes for the other sessions in the same batch commit."""
    a = await PostgresStore.open(postgres_dsn)
    b = await PostgresStore.open(postgres_dsn)
    sessions = [f"ses_{i}" for i in range(8)]
    try:
        for session in sessions:
            await a.create_session(
                SessionRecord(id=session, created=time.time(), kind="agent", entry="x", task="t")
            )
            await a.acquire_lease(session, "host-a:1", ttl=30)
            await a.create_run(
                RunRecord(
                    id=f"run_{session}",
                    session_id=session,
                    agent_name="x",
                    model="m",
                    created=time.time(),
                ),
                messages=[MessageRecord(run_id=f"run_{session}", seq=0, role="user", content="[]")],
            )
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:  # A stalls on ses_3
            conn.execute("UPDATE anabranch.leases SET expires = 0 WHERE session_id = 'ses_3'")
        await b.acquire_lease("ses_3", "host-b:2", ttl=30)
        outcomes: dict[str, str] = {}

        async def append(session: str) -> None:
            try:
                await a.append_messages(
                    [MessageRecord(run_id=f"run_{session}", seq=1, role="assistant", content="[]")]
                )
                outcomes[session] = "ok"
            except LeaseLostError:
                outcomes[session] = "fenced"

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                for session in sessions:
                    group.start_soon(append, session)
        assert outcomes == {s: "fenced" if s == "ses_3" else "ok" for s in sessions}
        for session in sessions:
            seqs = [m.seq for m in await b.load_messages(f"run_{session}")]
            assert seqs == ([0] if session == "ses_3" else [0, 1])
    finally:
        await a.close()
        await b.close()


@pytest.mark.anyio
async def test_opening_checks_the_schema(postgres_dsn: str) -> None:
    with pytest.raises(DatabaseError, match="no anabranch store"):
        await open_store(postgres_dsn, create=False)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA anabranch; CREATE TABLE anabranch.meta (key text, value text)")
    with pytest.raises(DatabaseError, match="not an anabranch store"):
        await open_store(postgres_dsn)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO anabranch.meta VALUES ('app', 'anabranch'), ('schema_version', '99')"
        )
    with pytest.raises(DatabaseError, match="newer than this anabranch"):
        await open_store(postgres_dsn)


async def continue_there(db: str, finished: str) -> None:
    async with Runtime(db=db, model=TestModel()) as rt:
        assert (await rt.resume(finished)).output.startswith("Report on: look up beta")
        third = await rt.run(Agent(name="looker", tools=[lookup]), "look up gamma")
        assert third.status == "done"  # the id sequences continue after the copied rows


def test_migrate_moves_sqlite_sessions_to_postgres(postgres_dsn: str, tmp_path: Path) -> None:
    sqlite = tmp_path / "runs.db"
    first = anyio.run(run_one, str(sqlite), "look up alpha")
    second = anyio.run(run_one, str(sqlite), "look up beta")
    before = anabranch("show", first, "--db", str(sqlite), "--calls")
    moved = anabranch("migrate", "--from", str(sqlite), "--to", postgres_dsn)
    assert moved.returncode == 0, moved.stderr
    assert "copied 2 sessions" in moved.stdout and password(postgres_dsn) not in moved.stdout
    after = anabranch("show", first, "--db", postgres_dsn, "--calls")
    assert after.returncode == 0, after.stderr
    assert after.stdout == before.stdout
    anyio.run(continue_there, postgres_dsn, second)
    again = anabranch("migrate", "--from", str(sqlite), "--to", postgres_dsn)
    assert again.returncode == 1 and "already has sessions" in again.stderr


def test_commands_that_need_postgres_say_so(tmp_path: Path) -> None:
    done = anabranch("worker", str(tmp_path / "defs.py"), "--db", str(tmp_path / "x.db"))
    assert done.returncode == 1
    assert "anabranch worker needs a PostgreSQL database" in done.stderr
    assert done.stderr.count("\n") == 1
