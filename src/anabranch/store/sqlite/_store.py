"""``SQLiteStore``: the write-ahead ``Store`` on one SQLite file.

The queries of sessions, leases, runs, cache breaks and spans are here; the reads of a
run's history in ``_history``, its writes in ``_history_writes``. Every statement goes
through ``GroupCommitConnection`` (atomic, durable on return, group-committed,
cancellation-safe, no raw ``sqlite3`` error escapes).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from anabranch._process import pid_alive
from anabranch.errors import SessionBusyError
from anabranch.store._records import (
    CallRecord,
    MessageRecord,
    RunRecord,
    RunStatus,
    SessionRecord,
    SnapshotRecord,
)
from anabranch.store._rows import (
    cache_break_row,
    run_end_row,
    run_row,
    run_span_row,
    session_event_row,
)
from anabranch.store.sqlite._budgets import SQLiteBudgets
from anabranch.store.sqlite._group_commit import GroupCommitConnection
from anabranch.store.sqlite._history import SQLiteHistory
from anabranch.store.sqlite._history_writes import SQLiteHistoryWrites
from anabranch.store.sqlite._index import index_new_rows
from anabranch.store.sqlite._limits import SQLiteContextLimits
from anabranch.store.sqlite._open import (
    Synchronous,
    lock_timeout_from_env,
    open_connection,
    open_read_only,
)
from anabranch.store.sqlite._rows import (
    INSERT_CALL,
    INSERT_MESSAGE,
    RUN_SQL,
    SESSION_SQL,
    call_values,
    fetch_rows,
    hex_bytes,
    hex_text,
    insert,
    message_row,
    snapshot_row,
)

__all__ = ["SQLiteStore", "Synchronous"]


def _live_owner(rows: Sequence[tuple[Any, ...]]) -> str | None:
    """The owner of a lease row that is still held (not expired, owner not dead here)."""
    if not rows:
        return None
    owner, host, pid, expires = rows[0]
    if expires <= time.time():
        return None
    if host == socket.gethostname() and not pid_alive(pid):
        return None
    return str(owner)


def _span_row(session_id: str, run_id: str, trace_id: str, span_id: str) -> dict[str, Any]:
    """A drive's ``run_spans`` row, its (hex) ids kept as the bytes they spell."""
    return run_span_row(session_id, run_id, hex_bytes(trace_id), hex_bytes(span_id))


class SQLiteStore(SQLiteHistory, SQLiteHistoryWrites, SQLiteContextLimits, SQLiteBudgets):
    """Async store over one SQLite file. Open with ``await SQLiteStore.open(path)``."""

    def __init__(self, path: Path, sql: GroupCommitConnection) -> None:
        super().__init__(sql)
        self.path = path

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        synchronous: Synchronous = "FULL",
        read_only: bool = False,
        lock_timeout: float | None = None,
    ) -> SQLiteStore:
        """Open (and with ``create``, create or migrate) an anabranch database.

        Args:
            read_only: never write the file (no mode change, WAL switch or migration); any
                write through this store fails. For inspecting a database, even one you
                cannot write or one an older anabranch still uses.
            lock_timeout: seconds to wait for another process's write lock before a
                ``StoreError`` says so (default ``$ANABRANCH_LOCK_TIMEOUT`` or 30).

        Raises:
            DatabaseError: no file (and ``create`` is false), not an anabranch database,
                a newer schema, or a corrupt file. Nothing is written in those cases.
        """
        limiter = anyio.CapacityLimiter(1)
        db_path = Path(os.fspath(path))
        timeout = lock_timeout if lock_timeout is not None else lock_timeout_from_env()
        if read_only:
            conn = await anyio.to_thread.run_sync(open_read_only, db_path, limiter=limiter)
        else:
            conn = await anyio.to_thread.run_sync(
                open_connection, db_path, create, synchronous, timeout, limiter=limiter
            )
        return cls(db_path, GroupCommitConnection(conn, limiter, lock_timeout=timeout))

    async def close(self) -> None:
        await self._sql.close()

    async def __aenter__(self) -> SQLiteStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ----------------------------------------------------------------- sessions
    async def create_session(
        self, session: SessionRecord, *, owner: str | None = None, ttl: float = 0.0
    ) -> None:
        """Commit a new session (with ``owner``: and its lease, see ``Store``)."""
        values = {
            "id": session.id,
            "created": session.created,
            "kind": session.kind,
            "entry": session.entry,
            "task": session.task,
            "source": session.source,
            "definition": session.definition,
        }
        lease = (owner, socket.gethostname(), os.getpid()) if owner is not None else None

        def write(conn: sqlite3.Connection) -> None:
            insert(conn, "sessions", values)
            insert(
                conn,
                "session_events",
                {"session_id": session.id, "status": "running", "created": session.created},
            )
            if lease is not None:  # a new session: no lease row can exist
                conn.execute(
                    "INSERT INTO leases(session_id, owner, host, pid, expires) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (session.id, *lease, time.time() + ttl),
                )

        await self._sql.write(write)

    async def set_session_status(
        self,
        session_id: str,
        status: RunStatus,
        *,
        output: str | None = None,
        error: str | None = None,
    ) -> None:
        values = session_event_row(session_id, status, output, error)
        await self._sql.write(lambda conn: insert(conn, "session_events", values))

    async def get_session(self, session_id: str) -> SessionRecord | None:
        rows = await self._sql.lookup(
            lambda conn: fetch_rows(conn, SESSION_SQL + " WHERE s.id = ?", (session_id,))
        )
        return SessionRecord(**rows[0]) if rows else None

    async def list_sessions(self, limit: int = 100) -> list[SessionRecord]:
        rows = await self._sql.read(
            lambda conn: fetch_rows(
                conn, SESSION_SQL + " ORDER BY s.created DESC LIMIT ?", (limit,)
            )
        )
        return [SessionRecord(**row) for row in rows]

    async def delete_session(self, session_id: str) -> bool:
        """Remove a session and everything recorded under it, search index included, in
        one transaction. The one deliberate exception to insert-only: for ``anabranch
        delete`` / ``prune``. False if there was no such session.

        Raises:
            SessionBusyError: a live process holds the session's lease.
        """

        def write(conn: sqlite3.Connection) -> bool:
            found = conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if found is None:
                return False
            holder = _live_owner(
                conn.execute(
                    "SELECT owner, host, pid, expires FROM leases WHERE session_id = ?",
                    (session_id,),
                ).fetchall()
            )
            if holder is not None:  # checked under the write lock: no one takes it meanwhile
                raise SessionBusyError(session_id, holder)
            runs = "SELECT id FROM runs WHERE session_id = ?"
            args = (session_id,)
            # external-content FTS5 tables forget a row only when told its old values (and
            # only one they hold: rows written earlier in this transaction are indexed first)
            index_new_rows(conn)
            conn.execute(
                "INSERT INTO history_fts(history_fts, rowid, body, run_id, source, ref) "
                "SELECT 'delete', id, body, run_id, source, ref FROM history_messages "
                f"WHERE run_id IN ({runs})",
                args,
            )
            conn.execute(
                "INSERT INTO history_spill_fts(history_spill_fts, rowid, body, run_id, source, "
                "ref) SELECT 'delete', id, body, run_id, source, ref FROM history_spills "
                f"WHERE run_id IN ({runs})",
                args,
            )
            conn.execute(
                "DELETE FROM call_outcomes WHERE call_id IN "
                f"(SELECT id FROM calls WHERE run_id IN ({runs}))",
                args,
            )
            for table in (
                "messages",
                "calls",
                "run_ends",
                "snapshots",
                "boundaries",
                "spills",
                "tool_events",
                "cache_breaks",
            ):
                conn.execute(f"DELETE FROM {table} WHERE run_id IN ({runs})", args)
            for table in ("run_spans", "session_events", "leases", "runs"):
                conn.execute(f"DELETE FROM {table} WHERE session_id = ?", args)
            conn.execute("DELETE FROM sessions WHERE id = ?", args)
            index_new_rows(conn)  # the marks come down if the top rows were this session's
            return True

        deleted: bool = await self._sql.write(write)
        return deleted

    # ----------------------------------------------------------------- leases
    async def acquire_lease(
        self, session_id: str, owner: str, ttl: float, *, running: bool = False
    ) -> None:
        """Take the session's lease, or raise ``SessionBusyError`` if a live owner has it
        (with ``running``: and record the session running, in the same transaction)."""
        host, pid = socket.gethostname(), os.getpid()
        event = session_event_row(session_id, "running") if running else None

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
            if event is not None:
                insert(conn, "session_events", event)

        await self._sql.write(write)

    async def renew_lease(self, session_id: str, owner: str, ttl: float) -> bool:
        """Extend the lease; False if ``owner`` no longer holds it (another process took
        it over after it expired)."""

        def write(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "UPDATE leases SET expires = ? WHERE session_id = ? AND owner = ?",
                (time.time() + ttl, session_id, owner),
            )
            return cursor.rowcount > 0

        return await self._sql.write(write)

    async def release_lease(
        self,
        session_id: str,
        owner: str,
        *,
        status: RunStatus | None = None,
        output: str | None = None,
        error: str | None = None,
    ) -> None:
        """Give the lease up (with ``status``: record the session's end first, in the same
        transaction)."""
        end = session_event_row(session_id, status, output, error) if status else None

        def write(conn: sqlite3.Connection) -> None:
            if end is not None:
                insert(conn, "session_events", end)
            conn.execute(
                "DELETE FROM leases WHERE session_id = ? AND owner = ?", (session_id, owner)
            )

        await self._sql.write(write)

    async def lease_holder(self, session_id: str) -> str | None:
        """The live owner of the session's lease, if any."""
        rows = await self._sql.lookup(
            lambda conn: conn.execute(
                "SELECT owner, host, pid, expires FROM leases WHERE session_id = ?",
                (session_id,),
            ).fetchall()
        )
        return _live_owner(rows)

    # ----------------------------------------------------------------- runs
    async def create_run(
        self,
        run: RunRecord,
        *,
        snapshot: SnapshotRecord | None = None,
        messages: Sequence[MessageRecord] = (),
        span: tuple[str, str] | None = None,
        call: CallRecord | None = None,
    ) -> int:
        """Commit a new run with its first prompt snapshot and messages in one transaction,
        so a crash never leaves a run without its task (with ``span``, its first drive's
        span row too; with ``call``, its first call's row last: that row's id)."""
        values = run_row(run)
        snapshot_values = snapshot_row(snapshot) if snapshot else None
        message_values = [message_row(m) for m in messages]
        span_values = _span_row(run.session_id, run.id, *span) if span is not None else None
        call_row = call_values(call) if call is not None else None

        def write(conn: sqlite3.Connection) -> int:
            insert(conn, "runs", values)
            if snapshot_values:
                insert(conn, "snapshots", snapshot_values)
            for value in message_values:
                INSERT_MESSAGE(conn, value)
            if span_values is not None:
                insert(conn, "run_spans", span_values)
            return INSERT_CALL(conn, call_row) if call_row is not None else 0

        return await self._sql.write(write)

    async def finish_run(
        self,
        run_id: str,
        status: RunStatus,
        *,
        output: str | None = None,
        error: str | None = None,
    ) -> None:
        values = run_end_row(run_id, output, status, error)
        await self._sql.write(lambda conn: insert(conn, "run_ends", values))

    async def get_run(self, run_id: str) -> RunRecord | None:
        rows = await self._sql.lookup(
            lambda conn: fetch_rows(conn, RUN_SQL + " WHERE r.id = ?", (run_id,))
        )
        return RunRecord(**rows[0]) if rows else None

    async def list_runs(self, session_id: str) -> list[RunRecord]:
        rows = await self._sql.read(
            lambda conn: fetch_rows(
                conn,
                RUN_SQL + " WHERE r.session_id = ? ORDER BY r.created, r.rowid",
                (session_id,),
            )
        )
        return [RunRecord(**row) for row in rows]

    async def find_child_run(self, parent_run_id: str, parent_call_id: str) -> RunRecord | None:
        rows = await self._sql.read(
            lambda conn: fetch_rows(
                conn,
                RUN_SQL + " WHERE r.parent_run_id = ? AND r.parent_call_id = ?",
                (parent_run_id, parent_call_id),
            )
        )
        return RunRecord(**rows[0]) if rows else None

    # ----------------------------------------------------------------- cache breaks
    async def add_cache_break(
        self, run_id: str, call_id: int, cause: str, expected_read: int, actual_read: int
    ) -> None:
        values = cache_break_row(run_id, call_id, cause, expected_read, actual_read)
        await self._sql.write(lambda conn: insert(conn, "cache_breaks", values))

    async def list_cache_breaks(self, session_id: str) -> list[dict[str, Any]]:
        return await self._sql.read(
            lambda conn: fetch_rows(
                conn,
                "SELECT * FROM cache_breaks WHERE run_id IN "
                "(SELECT id FROM runs WHERE session_id = ?) ORDER BY id",
                (session_id,),
            )
        )

    # ----------------------------------------------------------------- trace spans
    async def add_run_span(self, session_id: str, run_id: str, trace_id: str, span_id: str) -> None:
        """Remember the (hex) trace and span id of one drive of a run (for a graph's own
        span, ``run_id`` is the session id); kept as the bytes they spell."""
        values = _span_row(session_id, run_id, trace_id, span_id)
        await self._sql.write(lambda conn: insert(conn, "run_spans", values))

    async def run_spans(self, run_id: str, limit: int | None = None) -> list[tuple[str, str]]:
        """``(trace_id, span_id)`` of the earlier drives of a run (the latest ``limit`` of
        them, if given), oldest first."""
        sql = "SELECT trace_id, span_id FROM run_spans WHERE run_id = ? ORDER BY id DESC"
        params: tuple[Any, ...] = (run_id,)
        if limit is not None:
            sql += " LIMIT ?"
            params = (run_id, limit)
        rows = await self._sql.lookup(lambda conn: conn.execute(sql, params).fetchall())
        return [(hex_text(t), hex_text(s)) for t, s in reversed(rows)]

    # ----------------------------------------------------------------- generic read
    async def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Read-only SQL for reports and tools (``SELECT`` only)."""
        if not sql.lstrip().upper().startswith(("SELECT", "WITH")):
            raise ValueError("query() runs SELECT statements only")
        return await self._sql.read(lambda conn: fetch_rows(conn, sql, params))
