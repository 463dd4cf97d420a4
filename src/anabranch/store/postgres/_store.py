"""``PostgresStore``: the write-ahead store on one PostgreSQL database.

Its opening, sessions, leases and runs are here; the writes within a run in
``_run_writes``, the fenced write path under both in ``_fencing``, the reads in ``_reads``.

Invariants (the same as the SQLite store's, across processes and hosts):
- Every write is atomic, shielded from cancellation, and returns once committed.
- Group commit on one writer connection (see ``_connection``).
- Leases use the database's clock, so hosts with skewed clocks agree on expiry.
- Fencing: once another process has taken over a session this store held a lease on,
  every further write of this store for that session raises ``LeaseLostError`` and
  commits nothing. The check runs in the write's transaction under a share lock on the
  lease row, so a takeover cannot slip in between check and commit (``_fencing``, and
  ``_connection``: one check per batch for every leased session it writes to, pipelined
  with the writes).
- Opening never writes to a database whose ``anabranch`` schema is not ours or newer.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import asdict

from anabranch._process import pid_alive
from anabranch.store._dsn import redact_dsn
from anabranch.store._records import (
    CallRecord,
    MessageRecord,
    RunRecord,
    RunStatus,
    SessionBudgetRecord,
    SessionRecord,
    SnapshotRecord,
)
from anabranch.store._rows import (
    call_row,
    message_row,
    run_end_row,
    run_row,
    run_span_row,
    session_event_row,
    snapshot_row,
)
from anabranch.store.postgres._connection import NOW, Connections, Later, Tx, connect
from anabranch.store.postgres._leases import take_lease
from anabranch.store.postgres._migrate import migrate
from anabranch.store.postgres._run_writes import RunWrites
from anabranch.store.postgres._statements import insert, insert_id, rowcount

__all__ = ["PostgresStore"]

STALL_TIMEOUT = 30.0
"""Seconds a transaction may wait for its client before the server ends it (the default
lease ttl: a process frozen that long has lost its leases anyway)."""


class PostgresStore(RunWrites):
    """Async store over one PostgreSQL database (schema ``anabranch``).

    Open with ``await PostgresStore.open("postgresql://user@host/db")``. The DSN's password
    is never shown: ``repr`` and every error use ``redact_dsn``.
    """

    def __init__(self, dsn: str, connections: Connections) -> None:
        super().__init__(connections)
        self.url = redact_dsn(dsn)
        """The DSN without its password: safe to print."""

    def __repr__(self) -> str:
        return f"PostgresStore({self.url!r})"

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    async def open(
        cls, dsn: str, *, create: bool = True, stall_timeout: float = STALL_TIMEOUT
    ) -> PostgresStore:
        """Open (and with ``create``, create or migrate) the anabranch schema of a database.

        ``stall_timeout``: a transaction of this store left waiting for it that many
        seconds is ended by the server (this process is frozen: its locks must not keep
        its sessions from being taken over). Give it the lease ttl.

        Raises:
            DatabaseError: cannot connect, no schema (and ``create`` is false), a schema
                that is not anabranch's, or a newer one. Nothing is written in those cases.
        """
        import anyio.to_thread

        def open_connections() -> Connections:
            writer = connect(dsn, stall_timeout=stall_timeout)
            try:
                migrate(writer, create, redact_dsn(dsn))
                reader = connect(dsn, stall_timeout=stall_timeout)
            except BaseException:
                writer.close()
                raise
            return Connections(dsn, writer, reader, stall_timeout=stall_timeout)

        return cls(dsn, await anyio.to_thread.run_sync(open_connections))

    async def close(self) -> None:
        await self._connections.close()

    async def __aenter__(self) -> PostgresStore:
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
        event = {"session_id": session.id, "status": "running", "created": session.created}
        host, pid = socket.gethostname(), os.getpid()

        def write(tx: Tx) -> None:
            insert(tx, "sessions", values)
            insert(tx, "session_events", event)
            if owner is not None:
                take_lease(tx, session.id, owner, host, pid, ttl)

        await self._write(write, session=session.id)
        if owner is not None:
            self._hold(session.id, owner)

    async def set_session_status(
        self,
        session_id: str,
        status: RunStatus,
        *,
        output: str | None = None,
        error: str | None = None,
    ) -> None:
        values = session_event_row(session_id, status, output, error)
        await self._write(lambda tx: insert(tx, "session_events", values), session=session_id)

    # ----------------------------------------------------------------- leases
    async def acquire_lease(
        self, session_id: str, owner: str, ttl: float, *, running: bool = False
    ) -> None:
        """Take the session's lease, or raise ``SessionBusyError`` if a live owner has it
        (with ``running``: and record the session running, in the same transaction)."""
        host, pid = socket.gethostname(), os.getpid()
        event = session_event_row(session_id, "running") if running else None

        def write(tx: Tx) -> None:
            take_lease(tx, session_id, owner, host, pid, ttl)
            if event is not None:
                insert(tx, "session_events", event)

        await self._connections.write(write)
        self._hold(session_id, owner)

    async def renew_lease(self, session_id: str, owner: str, ttl: float) -> bool:
        """Extend the lease; False if ``owner`` no longer holds it (another process took
        it over after it expired)."""

        def write(tx: Tx) -> Later[bool]:
            return rowcount(
                tx.execute(
                    f"UPDATE leases SET expires = {NOW} + %s WHERE session_id = %s AND owner = %s",
                    (ttl, session_id, owner),
                )
            )

        renewed = await self._connections.write_later(write)
        if not renewed and self._held.get(session_id) == owner:
            self._let_go(session_id, lost=True)
        return renewed

    async def release_lease(
        self,
        session_id: str,
        owner: str,
        *,
        status: RunStatus | None = None,
        output: str | None = None,
        error: str | None = None,
    ) -> None:
        """Give the lease up. The row stays (expired) and keeps its owner, so a process
        that stalled past its lease is still recognised as fenced afterwards. With
        ``status``: record the session's end first, in the same (fenced) transaction."""
        end = session_event_row(session_id, status, output, error) if status else None

        def write(tx: Tx) -> Later[bool]:
            if end is not None:
                insert(tx, "session_events", end)
            return rowcount(
                tx.execute(
                    "UPDATE leases SET expires = 0 WHERE session_id = %s AND owner = %s",
                    (session_id, owner),
                )
            )

        fence = self._fence(session_id, None, None) if end is not None else None
        released = await self._connections.write_later(write, fence)
        if self._held.get(session_id) == owner:
            self._let_go(session_id, lost=not released)

    async def lease_holder(self, session_id: str) -> str | None:
        """The live owner of the session's lease, if any."""
        row = await self._one(
            f"SELECT owner, host, pid, expires > {NOW} AS live FROM leases WHERE session_id = %s",
            (session_id,),
        )
        if row is None or not row["live"]:
            return None
        if row["host"] == socket.gethostname() and not pid_alive(row["pid"]):
            return None
        return str(row["owner"])

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
        span_values = run_span_row(run.session_id, run.id, *span) if span is not None else None
        call_values = call_row(call) if call is not None else None

        def write(tx: Tx) -> Later[int]:
            insert(tx, "runs", values)
            if snapshot_values:
                insert(tx, "snapshots", snapshot_values)
            self._insert_messages(tx, message_values)
            if span_values is not None:
                insert(tx, "run_spans", span_values)
            return insert_id(tx, "calls", call_values) if call_values else Later(int)

        call_id = await self._write_later(write, session=run.session_id)
        self._run_sessions[run.id] = run.session_id
        if call_id:
            self._call_runs[call_id] = run.id
        return call_id

    async def finish_run(
        self, run_id: str, status: RunStatus, *, output: str | None = None, error: str | None = None
    ) -> None:
        values = run_end_row(run_id, output, status, error)
        await self._write(lambda tx: insert(tx, "run_ends", values), run=run_id)

    # ----------------------------------------------------------------- budgets, spans
    async def set_session_budget(self, record: SessionBudgetRecord) -> None:
        """Record the budget (and tenant) a session runs under from now on."""
        values = asdict(record)
        await self._write(
            lambda tx: insert(tx, "session_budgets", values), session=record.session_id
        )

    async def add_run_span(self, session_id: str, run_id: str, trace_id: str, span_id: str) -> None:
        """Remember the (hex) trace and span id of one drive of a run (for a graph's own
        span, ``run_id`` is the session id)."""
        values = run_span_row(session_id, run_id, trace_id, span_id)
        await self._write(lambda tx: insert(tx, "run_spans", values), session=session_id)
