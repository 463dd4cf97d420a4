"""``SQLiteStore``: the write-ahead store on one SQLite file.

Invariants:
- One connection, one worker thread at a time: every statement runs under a
  ``CapacityLimiter(1)``, so there is a single writer and never ``database is locked``
  between our own tasks.
- Every write is atomic and shielded from cancellation: a cancelled run leaves either the
  whole write or none of it, and a write returns only once it is committed.
- Group commit: writes that arrive while a transaction is being committed are committed
  together in the next one (each in its own savepoint, so one write's error rolls back
  only that write). A lone writer still gets its own ``BEGIN IMMEDIATE ... COMMIT``.
- The file is created owner-only (0600); WAL mode; ``synchronous=FULL`` unless told otherwise.
- Opening never writes to a file that is not an anabranch database.
"""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, TypeVar

import anyio
import anyio.to_thread
import sqlite_utils

from anabranch._process import pid_alive
from anabranch.errors import DatabaseError, SessionBusyError
from anabranch.store._records import (
    BoundaryRecord,
    CallRecord,
    HistoryHit,
    MessageRecord,
    RunRecord,
    RunStatus,
    SessionRecord,
    SnapshotRecord,
    SpillRecord,
    ToolEventRecord,
)
from anabranch.store._schema import APP_ID, SCHEMA_VERSION, migrate

__all__ = ["SQLiteStore", "Synchronous"]

T = TypeVar("T")
Synchronous = Literal["OFF", "NORMAL", "FULL", "EXTRA"]


def _create_owner_only(path: Path) -> None:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    os.close(fd)


@dataclass(eq=False)
class _Write:
    """One queued write: its function, and once committed, its result or error."""

    fn: Callable[[sqlite3.Connection], Any]
    done: bool = False
    result: Any = None
    error: BaseException | None = None
    wake: anyio.Event | None = None
    """Made when the write has to wait; set when it is committed or should lead next."""


def _commit_batch(conn: sqlite3.Connection, batch: list[_Write]) -> None:
    """Run ``batch`` in one transaction; each write in a savepoint when there are several."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        if len(batch) == 1:
            batch[0].result = batch[0].fn(conn)
        else:
            for write in batch:
                conn.execute("SAVEPOINT anabranch_write")
                try:
                    write.result = write.fn(conn)
                except Exception as exc:
                    conn.execute("ROLLBACK TO anabranch_write")
                    write.error = exc
                conn.execute("RELEASE anabranch_write")
        conn.execute("COMMIT")
    except BaseException as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        for write in batch:
            write.error = write.error or exc
            write.result = None
    finally:
        for write in batch:
            write.done = True


class SQLiteStore:
    """Async store over one SQLite file. Open with ``await SQLiteStore.open(path)``."""

    def __init__(self, path: Path, conn: sqlite3.Connection, limiter: anyio.CapacityLimiter):
        self.path = path
        self._conn = conn
        self._db = sqlite_utils.Database(conn)
        self._limiter = limiter
        """Held by whoever uses the connection (a task, for the length of its statement)."""
        self._thread = anyio.CapacityLimiter(1)
        self._queue: list[_Write] = []
        self._committing = False
        self._closed = False

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    async def open(
        cls, path: str | os.PathLike[str], *, create: bool = True, synchronous: Synchronous = "FULL"
    ) -> SQLiteStore:
        """Open (and with ``create``, create or migrate) an anabranch database.

        Raises:
            DatabaseError: no file (and ``create`` is false), not an anabranch database,
                a newer schema, or a corrupt file. Nothing is written in those cases.
        """
        limiter = anyio.CapacityLimiter(1)
        db_path = Path(os.fspath(path))
        conn = await anyio.to_thread.run_sync(
            cls._connect, db_path, create, synchronous, limiter=limiter
        )
        return cls(db_path, conn, limiter)

    @staticmethod
    def _connect(path: Path, create: bool, synchronous: Synchronous) -> sqlite3.Connection:
        path = path.expanduser()
        if not path.exists():
            if not create:
                raise DatabaseError(f"no anabranch database at {path}")
            if not path.parent.exists():
                raise DatabaseError(f"cannot create {path}: folder {path.parent} does not exist")
            _create_owner_only(path)
        elif path.is_dir():
            raise DatabaseError(f"{path} is a folder, not a database file")
        elif Path(f"{path}-wal").exists():
            # Check through a read-only connection first: closing a read-write one would
            # checkpoint the WAL into a file we may be about to refuse (a newer schema).
            SQLiteStore._check_read_only(path)
        try:
            conn = sqlite3.connect(
                path, check_same_thread=False, isolation_level=None, timeout=30.0
            )
        except sqlite3.Error as exc:
            raise DatabaseError(f"cannot open {path}: {exc}") from exc
        try:
            version = SQLiteStore._check(conn, path)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={synchronous}")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA busy_timeout=30000")
            if version < SCHEMA_VERSION:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    db = sqlite_utils.Database(conn)
                    migrate(db, version)
                    conn.execute(
                        "INSERT OR REPLACE INTO meta(key, value) VALUES ('app', ?), "
                        "('schema_version', ?)",
                        (APP_ID, str(SCHEMA_VERSION)),
                    )
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _check_read_only(path: Path) -> None:
        try:
            conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
        except sqlite3.Error as exc:
            raise DatabaseError(f"cannot open {path}: {exc}") from exc
        try:
            SQLiteStore._check(conn, path)
        finally:
            conn.close()

    @staticmethod
    def _check(conn: sqlite3.Connection, path: Path) -> int:
        """The schema version of an existing file (0 if empty). Reads only."""
        try:
            tables = {
                row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            meta = (
                dict(conn.execute("SELECT key, value FROM meta").fetchall())
                if "meta" in tables
                else {}
            )
        except sqlite3.DatabaseError as exc:
            if "malformed" in str(exc):
                raise DatabaseError(f"{path} is corrupt: {exc}") from exc
            raise DatabaseError(f"{path} is not a readable SQLite database: {exc}") from exc
        if not tables:
            return 0
        if meta.get("app") != APP_ID:
            raise DatabaseError(f"{path} is not an anabranch database")
        version = int(meta.get("schema_version", "0"))
        if version > SCHEMA_VERSION:
            raise DatabaseError(
                f"{path} has schema version {version}, newer than this anabranch "
                f"understands ({SCHEMA_VERSION}); upgrade anabranch"
            )
        try:
            check = conn.execute("PRAGMA quick_check").fetchone()
        except sqlite3.DatabaseError as exc:
            raise DatabaseError(f"{path} is corrupt: {exc}") from exc
        if check is None or check[0] != "ok":
            raise DatabaseError(f"{path} is corrupt: {check[0] if check else 'no answer'}")
        return version

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            async with self._limiter:
                await anyio.to_thread.run_sync(self._conn.close, limiter=self._thread)

    async def __aenter__(self) -> SQLiteStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ----------------------------------------------------------------- plumbing
    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        async with self._limiter:
            return await anyio.to_thread.run_sync(fn, self._conn, limiter=self._thread)

    async def _lookup(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A point read through an index (a few rows, well under a millisecond): run on the
        event loop's thread, where a hop to the worker thread would cost more than it."""
        async with self._limiter:
            return fn(self._conn)

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Commit ``fn``'s statements atomically (possibly together with other writes).

        The first writer to find no commit in progress leads: it commits every queued
        write in one transaction, then wakes them and the first writer queued meanwhile,
        which leads the next commit.
        """
        write = _Write(fn)
        self._queue.append(write)
        with anyio.CancelScope(shield=True):
            while not write.done:
                if self._committing:
                    write.wake = anyio.Event()
                    await write.wake.wait()
                    continue
                await self._commit_queue()
        if write.error is not None:
            raise write.error
        result: T = write.result
        return result

    async def _commit_queue(self) -> None:
        self._committing = True
        batch, self._queue = self._queue, []
        try:
            async with self._limiter:
                await anyio.to_thread.run_sync(
                    _commit_batch, self._conn, batch, limiter=self._thread
                )
        except BaseException as exc:  # the batch never ran: fail its writes, not hang them
            for write in batch:
                if not write.done:
                    write.error, write.done = exc, True
            raise
        finally:
            self._committing = False
            # wake the next leader first: its commit then overlaps with this batch's
            # writers going on with their work
            if self._queue and self._queue[0].wake is not None:
                self._queue[0].wake.set()
            for write in batch:
                if write.wake is not None:
                    write.wake.set()

    @staticmethod
    def _insert(conn: sqlite3.Connection, table: str, values: dict[str, Any]) -> int:
        columns = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        cursor = conn.execute(
            f"INSERT INTO {table} ({columns}) VALUES ({marks})", tuple(values.values())
        )
        return int(cursor.lastrowid or 0)

    @staticmethod
    def _rows(
        conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()
    ) -> list[dict[str, Any]]:
        cursor = conn.execute(sql, tuple(params))
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    # ----------------------------------------------------------------- sessions
    async def create_session(self, session: SessionRecord) -> None:
        values = {
            "id": session.id,
            "created": session.created,
            "kind": session.kind,
            "entry": session.entry,
            "task": session.task,
            "source": session.source,
            "definition": session.definition,
        }

        def write(conn: sqlite3.Connection) -> None:
            self._insert(conn, "sessions", values)
            self._insert(
                conn,
                "session_events",
                {"session_id": session.id, "status": "running", "created": session.created},
            )

        await self._write(write)

    async def set_session_status(
        self,
        session_id: str,
        status: RunStatus,
        *,
        output: str | None = None,
        error: str | None = None,
    ) -> None:
        values = {
            "session_id": session_id,
            "status": status,
            "output": output,
            "error": error,
            "created": time.time(),
        }
        await self._write(lambda conn: self._insert(conn, "session_events", values))

    _SESSION_SQL = """
        SELECT s.*, e.status AS status, e.output AS output, e.error AS error,
               CASE WHEN e.status = 'running' THEN NULL ELSE e.created END AS finished
        FROM sessions s
        JOIN session_events e ON e.id = (
            SELECT MAX(id) FROM session_events WHERE session_id = s.id)
    """

    async def get_session(self, session_id: str) -> SessionRecord | None:
        rows = await self._lookup(
            lambda conn: self._rows(conn, self._SESSION_SQL + " WHERE s.id = ?", (session_id,))
        )
        return SessionRecord(**rows[0]) if rows else None

    async def list_sessions(self, limit: int = 100) -> list[SessionRecord]:
        rows = await self._read(
            lambda conn: self._rows(
                conn, self._SESSION_SQL + " ORDER BY s.created DESC LIMIT ?", (limit,)
            )
        )
        return [SessionRecord(**row) for row in rows]

    # ----------------------------------------------------------------- leases
    async def acquire_lease(self, session_id: str, owner: str, ttl: float) -> None:
        """Take the session's lease, or raise ``SessionBusyError`` if a live owner has it."""
        host, pid = socket.gethostname(), os.getpid()

        def write(conn: sqlite3.Connection) -> None:
            row = conn.execute(
                "SELECT owner, host, pid, expires FROM leases WHERE session_id = ?",
                (session_id,),
            ).fetchone()
            now = time.time()
            if row is not None and row[0] != owner:
                held_owner, held_host, held_pid, expires = row
                dead = held_host == host and held_pid != pid and not pid_alive(held_pid)
                if expires > now and not dead:
                    raise SessionBusyError(session_id, f"{held_owner} on {held_host}")
            conn.execute(
                "INSERT OR REPLACE INTO leases(session_id, owner, host, pid, expires) "
                "VALUES (?, ?, ?, ?, ?)",
                (session_id, owner, host, pid, now + ttl),
            )

        await self._write(write)

    async def renew_lease(self, session_id: str, owner: str, ttl: float) -> bool:
        """Extend the lease; False if ``owner`` no longer holds it (another process took
        it over after it expired)."""

        def write(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "UPDATE leases SET expires = ? WHERE session_id = ? AND owner = ?",
                (time.time() + ttl, session_id, owner),
            )
            return cursor.rowcount > 0

        return await self._write(write)

    async def release_lease(self, session_id: str, owner: str) -> None:
        await self._write(
            lambda conn: conn.execute(
                "DELETE FROM leases WHERE session_id = ? AND owner = ?", (session_id, owner)
            )
        )

    async def lease_holder(self, session_id: str) -> str | None:
        """The live owner of the session's lease, if any."""
        rows = await self._lookup(
            lambda conn: conn.execute(
                "SELECT owner, host, pid, expires FROM leases WHERE session_id = ?",
                (session_id,),
            ).fetchall()
        )
        if not rows:
            return None
        owner, host, pid, expires = rows[0]
        if expires <= time.time():
            return None
        if host == socket.gethostname() and not pid_alive(pid):
            return None
        return str(owner)

    # ----------------------------------------------------------------- runs
    async def create_run(
        self,
        run: RunRecord,
        *,
        snapshot: SnapshotRecord | None = None,
        messages: Sequence[MessageRecord] = (),
    ) -> None:
        """Commit a new run with its first prompt snapshot and messages in one transaction,
        so a crash never leaves a run without its task."""
        values = {
            "id": run.id,
            "session_id": run.session_id,
            "parent_run_id": run.parent_run_id,
            "parent_call_id": run.parent_call_id,
            "task_id": run.task_id,
            "agent_name": run.agent_name,
            "model": run.model,
            "depth": run.depth,
            "mode": run.mode,
            "created": run.created,
        }
        snapshot_values = self._snapshot_values(snapshot) if snapshot else None
        message_values = [self._message_values(m) for m in messages]

        def write(conn: sqlite3.Connection) -> None:
            self._insert(conn, "runs", values)
            if snapshot_values:
                self._insert(conn, "snapshots", snapshot_values)
            for value in message_values:
                self._insert(conn, "messages", value)

        await self._write(write)

    async def finish_run(
        self,
        run_id: str,
        status: RunStatus,
        *,
        output: str | None = None,
        error: str | None = None,
    ) -> None:
        values = {
            "run_id": run_id,
            "status": status,
            "output": output,
            "error": error,
            "finished": time.time(),
        }
        await self._write(lambda conn: self._insert(conn, "run_ends", values))

    _RUN_SQL = """
        SELECT r.*, COALESCE(e.status, 'running') AS status, e.output AS output,
               e.error AS error, e.finished AS finished
        FROM runs r LEFT JOIN run_ends e ON e.run_id = r.id
    """

    async def get_run(self, run_id: str) -> RunRecord | None:
        rows = await self._lookup(
            lambda conn: self._rows(conn, self._RUN_SQL + " WHERE r.id = ?", (run_id,))
        )
        return RunRecord(**rows[0]) if rows else None

    async def list_runs(self, session_id: str) -> list[RunRecord]:
        rows = await self._read(
            lambda conn: self._rows(
                conn,
                self._RUN_SQL + " WHERE r.session_id = ? ORDER BY r.created, r.rowid",
                (session_id,),
            )
        )
        return [RunRecord(**row) for row in rows]

    async def find_child_run(self, parent_run_id: str, parent_call_id: str) -> RunRecord | None:
        rows = await self._read(
            lambda conn: self._rows(
                conn,
                self._RUN_SQL + " WHERE r.parent_run_id = ? AND r.parent_call_id = ?",
                (parent_run_id, parent_call_id),
            )
        )
        return RunRecord(**rows[0]) if rows else None

    # ----------------------------------------------------------------- messages & calls
    @staticmethod
    def _message_values(message: MessageRecord) -> dict[str, Any]:
        return {
            "run_id": message.run_id,
            "seq": message.seq,
            "role": message.role,
            "content": message.content,
            "kind": message.kind,
            "created": message.created or time.time(),
        }

    async def append_messages(self, messages: Sequence[MessageRecord]) -> None:
        """Commit messages in one transaction."""
        values = [self._message_values(m) for m in messages]

        def write(conn: sqlite3.Connection) -> None:
            for value in values:
                self._insert(conn, "messages", value)

        if values:
            await self._write(write)

    async def begin_call(self, call: CallRecord, messages: Sequence[MessageRecord]) -> int:
        """Commit pending messages and the call row together, before the request is sent."""
        values = [self._message_values(m) for m in messages]
        call_values = {
            "run_id": call.run_id,
            "turn": call.turn,
            "attempt": call.attempt,
            "fingerprint": call.fingerprint,
            "message_count": call.message_count,
            "created": call.created,
            "snapshot_version": call.snapshot_version,
            "compactions": call.compactions,
        }

        def write(conn: sqlite3.Connection) -> int:
            for value in values:
                self._insert(conn, "messages", value)
            return self._insert(conn, "calls", call_values)

        return await self._write(write)

    async def finish_call(
        self,
        call_id: int,
        *,
        status: Literal["ok", "error", "interrupted"],
        message: MessageRecord | None = None,
        error_type: str | None = None,
        error: str | None = None,
        response_id: str | None = None,
        model: str | None = None,
        stop_reason: str | None = None,
        usage: str | None = None,
        tool_events: Sequence[ToolEventRecord] = (),
    ) -> None:
        """Commit the call's outcome (and the assistant message, and the ``started`` events
        of the tool calls it asks for) in one transaction."""
        message_values = self._message_values(message) if message else None
        events = [self._tool_event_values(e) for e in tool_events]
        outcome = {
            "call_id": call_id,
            "status": status,
            "error_type": error_type,
            "error": error,
            "response_id": response_id,
            "model": model,
            "stop_reason": stop_reason,
            "usage": usage,
            "message_seq": message.seq if message else None,
            "created": time.time(),
        }

        def write(conn: sqlite3.Connection) -> None:
            if message_values:
                self._insert(conn, "messages", message_values)
            self._insert(conn, "call_outcomes", outcome)
            for event in events:
                self._insert(conn, "tool_events", event)

        await self._write(write)

    async def close_interrupted_calls(self, run_id: str) -> list[CallRecord]:
        """Record an ``interrupted`` outcome for every call of the run still in flight.

        Only the lease holder calls this on resume: no other process can have a call of
        this run in flight, so these are calls a crash cut off. Returns them.
        """

        def write(conn: sqlite3.Connection) -> list[CallRecord]:
            rows = self._rows(
                conn,
                self._CALL_SQL + " WHERE c.run_id = ? AND o.id IS NULL ORDER BY c.id",
                (run_id,),
            )
            now = time.time()
            for row in rows:
                self._insert(
                    conn,
                    "call_outcomes",
                    {
                        "call_id": row["id"],
                        "status": "interrupted",
                        "error": "the process stopped before the response was committed",
                        "created": now,
                    },
                )
            return [CallRecord(**row) for row in rows]

        return await self._write(write)

    async def load_messages(
        self, run_id: str, *, from_seq: int = 0, to_seq: int | None = None
    ) -> list[MessageRecord]:
        sql = "SELECT * FROM messages WHERE run_id = ? AND seq >= ?"
        params: list[Any] = [run_id, from_seq]
        if to_seq is not None:
            sql += " AND seq <= ?"
            params.append(to_seq)
        rows = await self._read(lambda conn: self._rows(conn, sql + " ORDER BY seq", params))
        return [MessageRecord(**row) for row in rows]

    async def next_seq(self, run_id: str) -> int:
        row = await self._lookup(
            lambda conn: conn.execute(
                "SELECT COALESCE(MAX(seq), -1) FROM messages WHERE run_id = ?", (run_id,)
            ).fetchone()
        )
        return int(row[0]) + 1

    _CALL_SQL = """
        SELECT c.*, o.status AS status, o.error_type AS error_type, o.error AS error,
               o.response_id AS response_id, o.model AS model, o.stop_reason AS stop_reason,
               o.usage AS usage, o.message_seq AS message_seq, o.created AS finished
        FROM calls c LEFT JOIN call_outcomes o ON o.call_id = c.id
    """

    async def list_calls(self, run_id: str) -> list[CallRecord]:
        rows = await self._read(
            lambda conn: self._rows(
                conn, self._CALL_SQL + " WHERE c.run_id = ? ORDER BY c.id", (run_id,)
            )
        )
        return [CallRecord(**row) for row in rows]

    async def recent_ok_calls(self, run_id: str, *, up_to: int, limit: int = 2) -> list[CallRecord]:
        """The run's last ``limit`` successful calls with id <= ``up_to``, newest first.

        A run's calls are numbered by turn in id order (a retry keeps its turn), so walking
        the (run_id, turn) index backwards is id order: no sort of the run's whole history.
        """
        rows = await self._lookup(
            lambda conn: self._rows(
                conn,
                self._CALL_SQL + " WHERE c.run_id = ? AND c.id <= ? AND o.status = 'ok'"
                " ORDER BY c.turn DESC, c.id DESC LIMIT ?",
                (run_id, up_to, limit),
            )
        )
        return [CallRecord(**row) for row in rows]

    async def last_call(self, run_id: str, *, ok: bool = False) -> CallRecord | None:
        """The run's latest call (with ``ok``: latest successful one), read from the end of
        the (run_id, turn) index: a run's calls are numbered by turn in id order."""
        status = " AND o.status = 'ok'" if ok else ""
        rows = await self._lookup(
            lambda conn: self._rows(
                conn,
                self._CALL_SQL
                + f" WHERE c.run_id = ?{status} ORDER BY c.turn DESC, c.id DESC LIMIT 1",
                (run_id,),
            )
        )
        return CallRecord(**rows[0]) if rows else None

    async def count_calls(self, run_id: str, status: str = "ok") -> int:
        """How many of the run's call attempts ended with ``status`` (no rows loaded)."""
        row = await self._lookup(
            lambda conn: conn.execute(
                "SELECT COUNT(*) FROM calls c JOIN call_outcomes o ON o.call_id = c.id "
                "WHERE c.run_id = ? AND o.status = ?",
                (run_id, status),
            ).fetchone()
        )
        return int(row[0])

    async def last_ok_turn(self, run_id: str) -> int:
        """The turn of the run's latest successful call (0 if none). A run's successful calls
        are turns 1..n, so this is their count, read from the end of the (run_id, turn)
        index instead of counting the whole history."""
        row = await self._lookup(
            lambda conn: conn.execute(
                "SELECT c.turn FROM calls c JOIN call_outcomes o ON o.call_id = c.id "
                "WHERE c.run_id = ? AND o.status = 'ok' ORDER BY c.turn DESC, c.id DESC LIMIT 1",
                (run_id,),
            ).fetchone()
        )
        return int(row[0]) if row else 0

    async def sum_call_usage(
        self, session_id: str, keys: Sequence[str], *, run_id: str | None = None
    ) -> dict[str, int]:
        """Sums of integer ``keys`` of the usage JSON of the session's (or run's) successful
        calls, computed in SQL: a long session's usage costs no rows in Python."""
        for key in keys:
            if not key.isidentifier():
                raise ValueError(f"not a usage key: {key!r}")
        sums = ", ".join(f"COALESCE(SUM(json_extract(o.usage, '$.{key}')), 0)" for key in keys)
        sql = (
            f"SELECT {sums} FROM calls c JOIN call_outcomes o ON o.call_id = c.id "
            "WHERE o.status = 'ok' AND o.usage IS NOT NULL AND "
        )
        if run_id is not None:
            sql += "c.run_id = ?"
            params: tuple[str, ...] = (run_id,)
        else:
            sql += "c.run_id IN (SELECT id FROM runs WHERE session_id = ?)"
            params = (session_id,)
        row = await self._read(lambda conn: conn.execute(sql, params).fetchone())
        return {key: int(value) for key, value in zip(keys, row, strict=True)}

    async def session_calls(self, session_id: str) -> list[CallRecord]:
        rows = await self._read(
            lambda conn: self._rows(
                conn,
                self._CALL_SQL
                + " WHERE c.run_id IN (SELECT id FROM runs WHERE session_id = ?) ORDER BY c.id",
                (session_id,),
            )
        )
        return [CallRecord(**row) for row in rows]

    # ----------------------------------------------------------------- tools
    @staticmethod
    def _tool_event_values(event: ToolEventRecord) -> dict[str, Any]:
        return {
            "run_id": event.run_id,
            "call_id": event.call_id,
            "name": event.name,
            "event": event.event,
            "content": event.content,
            "is_error": int(event.is_error),
            "created": event.created,
        }

    async def record_tool_event(self, event: ToolEventRecord) -> None:
        values = self._tool_event_values(event)
        await self._write(lambda conn: self._insert(conn, "tool_events", values))

    async def tool_events(self, run_id: str, call_ids: Sequence[str]) -> list[ToolEventRecord]:
        if not call_ids:
            return []
        marks = ", ".join("?" for _ in call_ids)
        rows = await self._lookup(
            lambda conn: self._rows(
                conn,
                f"SELECT * FROM tool_events WHERE run_id = ? AND call_id IN ({marks}) ORDER BY id",
                (run_id, *call_ids),
            )
        )
        return [ToolEventRecord(**{**row, "is_error": bool(row["is_error"])}) for row in rows]

    # ----------------------------------------------------------------- snapshots
    @staticmethod
    def _snapshot_values(snapshot: SnapshotRecord) -> dict[str, Any]:
        return {
            "run_id": snapshot.run_id,
            "version": snapshot.version,
            "reason": snapshot.reason,
            "system": snapshot.system,
            "tools": snapshot.tools,
            "created": snapshot.created,
        }

    async def save_snapshot(self, snapshot: SnapshotRecord) -> None:
        values = self._snapshot_values(snapshot)
        await self._write(lambda conn: self._insert(conn, "snapshots", values))

    async def latest_snapshot(self, run_id: str) -> SnapshotRecord | None:
        rows = await self._lookup(
            lambda conn: self._rows(
                conn,
                "SELECT * FROM snapshots WHERE run_id = ? ORDER BY version DESC LIMIT 1",
                (run_id,),
            )
        )
        return SnapshotRecord(**rows[0]) if rows else None

    async def get_snapshot(self, run_id: str, version: int) -> SnapshotRecord | None:
        rows = await self._read(
            lambda conn: self._rows(
                conn,
                "SELECT * FROM snapshots WHERE run_id = ? AND version = ?",
                (run_id, version),
            )
        )
        return SnapshotRecord(**rows[0]) if rows else None

    async def list_snapshots(self, run_id: str) -> list[SnapshotRecord]:
        """Every snapshot of a run, oldest first."""
        rows = await self._read(
            lambda conn: self._rows(
                conn, "SELECT * FROM snapshots WHERE run_id = ? ORDER BY version", (run_id,)
            )
        )
        return [SnapshotRecord(**row) for row in rows]

    # ----------------------------------------------------------------- boundaries
    async def add_boundary(
        self, boundary: BoundaryRecord, messages: Sequence[MessageRecord] = ()
    ) -> int:
        """Commit a boundary (and any messages that belong with it) atomically."""
        values = {f.name: getattr(boundary, f.name) for f in fields(boundary)}
        values.pop("id")
        values.pop("details")
        message_values = [self._message_values(m) for m in messages]

        def write(conn: sqlite3.Connection) -> int:
            for value in message_values:
                self._insert(conn, "messages", value)
            return self._insert(conn, "boundaries", values)

        return await self._write(write)

    async def list_boundaries(
        self, *, run_id: str | None = None, session_id: str | None = None
    ) -> list[BoundaryRecord]:
        if run_id is not None:
            sql, params = "SELECT * FROM boundaries WHERE run_id = ? ORDER BY id", (run_id,)
        else:
            sql = (
                "SELECT * FROM boundaries WHERE run_id IN "
                "(SELECT id FROM runs WHERE session_id = ?) ORDER BY id"
            )
            params = (session_id or "",)
        rows = await self._read(lambda conn: self._rows(conn, sql, params))
        return [BoundaryRecord(**row) for row in rows]

    async def get_boundary(self, boundary_id: int) -> BoundaryRecord | None:
        rows = await self._read(
            lambda conn: self._rows(conn, "SELECT * FROM boundaries WHERE id = ?", (boundary_id,))
        )
        return BoundaryRecord(**rows[0]) if rows else None

    async def count_boundaries(self, run_id: str, status: str = "ok") -> int:
        row = await self._lookup(
            lambda conn: conn.execute(
                "SELECT COUNT(*) FROM boundaries WHERE run_id = ? AND status = ?",
                (run_id, status),
            ).fetchone()
        )
        return int(row[0])

    async def latest_boundary(self, run_id: str) -> BoundaryRecord | None:
        rows = await self._lookup(
            lambda conn: self._rows(
                conn,
                "SELECT * FROM boundaries WHERE run_id = ? AND status = 'ok' "
                "ORDER BY id DESC LIMIT 1",
                (run_id,),
            )
        )
        return BoundaryRecord(**rows[0]) if rows else None

    # ----------------------------------------------------------------- spills
    async def save_spill(self, handle: str, run_id: str, call_id: str, content: str) -> None:
        values = {
            "handle": handle,
            "run_id": run_id,
            "call_id": call_id,
            "content": content,
            "created": time.time(),
        }
        await self._write(
            lambda conn: conn.execute(
                "INSERT OR IGNORE INTO spills(handle, run_id, call_id, content, created) "
                "VALUES (:handle, :run_id, :call_id, :content, :created)",
                values,
            )
        )

    async def get_spill(self, handle: str) -> str | None:
        rows = await self._read(
            lambda conn: conn.execute(
                "SELECT content FROM spills WHERE handle = ?", (handle,)
            ).fetchall()
        )
        return str(rows[0][0]) if rows else None

    async def get_spill_record(self, handle: str) -> SpillRecord | None:
        """The spill behind ``handle`` with the run that saved it."""
        rows = await self._read(
            lambda conn: self._rows(conn, "SELECT * FROM spills WHERE handle = ?", (handle,))
        )
        return SpillRecord(**rows[0]) if rows else None

    # ----------------------------------------------------------------- history search
    async def search_history(self, run_id: str, text: str, limit: int = 5) -> list[HistoryHit]:
        """Full-text matches of ``text``'s words in one run's original messages and spills.

        Every word must match; if nothing does, any word may. Best matches first.
        """
        words = re.findall(r"\w+", text)
        if not words:
            return []
        quoted = ['"' + w.replace('"', '""') + '"' for w in words]
        sql = (
            " UNION ALL ".join(
                f"SELECT source, ref, snippet({table}, 0, '[', ']', '…', 16) AS snippet, "
                f"rank FROM {table} WHERE {table} MATCH ? AND run_id = ?"
                for table in ("history_fts", "history_spill_fts")
            )
            + " ORDER BY rank LIMIT ?"
        )

        def search(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            match = " ".join(quoted)
            rows = self._rows(conn, sql, (match, run_id, match, run_id, limit))
            if not rows and len(quoted) > 1:
                match = " OR ".join(quoted)
                rows = self._rows(conn, sql, (match, run_id, match, run_id, limit))
            return rows

        rows = await self._read(search)
        return [HistoryHit(row["source"], str(row["ref"]), row["snippet"]) for row in rows]

    # ----------------------------------------------------------------- cache breaks
    async def add_cache_break(
        self, run_id: str, call_id: int, cause: str, expected_read: int, actual_read: int
    ) -> None:
        values = {
            "run_id": run_id,
            "call_id": call_id,
            "cause": cause,
            "expected_read": expected_read,
            "actual_read": actual_read,
            "created": time.time(),
        }
        await self._write(lambda conn: self._insert(conn, "cache_breaks", values))

    async def list_cache_breaks(self, session_id: str) -> list[dict[str, Any]]:
        return await self._read(
            lambda conn: self._rows(
                conn,
                "SELECT * FROM cache_breaks WHERE run_id IN "
                "(SELECT id FROM runs WHERE session_id = ?) ORDER BY id",
                (session_id,),
            )
        )

    # ----------------------------------------------------------------- trace spans
    async def add_run_span(self, session_id: str, run_id: str, trace_id: str, span_id: str) -> None:
        """Remember the (hex) trace and span id of one drive of a run (for a graph's own
        span, ``run_id`` is the session id)."""
        values = {
            "session_id": session_id,
            "run_id": run_id,
            "trace_id": trace_id,
            "span_id": span_id,
            "created": time.time(),
        }
        await self._write(lambda conn: self._insert(conn, "run_spans", values))

    async def run_spans(self, run_id: str, limit: int | None = None) -> list[tuple[str, str]]:
        """``(trace_id, span_id)`` of the earlier drives of a run (the latest ``limit`` of
        them, if given), oldest first."""
        sql = "SELECT trace_id, span_id FROM run_spans WHERE run_id = ? ORDER BY id DESC"
        params: tuple[Any, ...] = (run_id,)
        if limit is not None:
            sql += " LIMIT ?"
            params = (run_id, limit)
        rows = await self._lookup(lambda conn: conn.execute(sql, params).fetchall())
        return [(str(t), str(s)) for t, s in reversed(rows)]

    # ----------------------------------------------------------------- generic read
    async def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Read-only SQL for reports and tools (``SELECT`` only)."""
        if not sql.lstrip().upper().startswith(("SELECT", "WITH")):
            raise ValueError("query() runs SELECT statements only")
        return await self._read(lambda conn: self._rows(conn, sql, params))
