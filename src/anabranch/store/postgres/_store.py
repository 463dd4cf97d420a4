"""``PostgresStore``: the write-ahead store on one PostgreSQL database.

Invariants (the same as the SQLite store's, across processes and hosts):
- Every write is atomic, shielded from cancellation, and returns once committed.
- Group commit on one writer connection (see ``_connection``).
- Leases use the database's clock, so hosts with skewed clocks agree on expiry.
- Fencing: once another process has taken over a session this store held a lease on,
  every further write of this store for that session raises ``LeaseLostError`` and
  commits nothing. The check runs in the write's transaction under a share lock on the
  lease row, so a takeover cannot slip in between check and commit (``_connection``:
  one check per batch for every leased session it writes to, pipelined with the writes).
- Opening never writes to a database whose ``anabranch`` schema is not ours or newer.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, Literal, TypeVar

from anabranch._process import pid_alive
from anabranch.errors import LeaseLostError
from anabranch.store._dsn import redact_dsn
from anabranch.store._records import (
    BoundaryRecord,
    CallRecord,
    ContextLimitRecord,
    MessageRecord,
    RunRecord,
    RunStatus,
    SessionBudgetRecord,
    SessionRecord,
    SnapshotRecord,
    SpendRecord,
    SpillRecord,
    ToolEventRecord,
)
from anabranch.store._rows import (
    boundary_row,
    cache_break_row,
    call_outcome_rows,
    call_row,
    interrupted_outcome_row,
    message_row,
    run_end_row,
    run_row,
    run_span_row,
    session_event_row,
    snapshot_row,
    spill_row,
    tool_event_row,
)
from anabranch.store.postgres._connection import NOW, Connections, Fence, Later, Tx, connect
from anabranch.store.postgres._leases import take_lease
from anabranch.store.postgres._migrate import migrate
from anabranch.store.postgres._reads import Reads
from anabranch.store.postgres._statements import (
    SAVE_SPILL,
    insert,
    insert_id,
    rowcount,
)

__all__ = ["PostgresStore"]

T = TypeVar("T")

STALL_TIMEOUT = 30.0
"""Seconds a transaction may wait for its client before the server ends it (the default
lease ttl: a process frozen that long has lost its leases anyway)."""


class PostgresStore(Reads):
    """Async store over one PostgreSQL database (schema ``anabranch``).

    Open with ``await PostgresStore.open("postgresql://user@host/db")``. The DSN's password
    is never shown: ``repr`` and every error use ``redact_dsn``.
    """

    def __init__(self, dsn: str, connections: Connections) -> None:
        super().__init__(connections)
        connections.lost = self._lease_lost
        self.url = redact_dsn(dsn)
        """The DSN without its password: safe to print."""
        self._held: dict[str, str] = {}
        """Sessions this store holds a lease on, and the owner it took them for."""
        self._lost: set[str] = set()
        """Sessions another process took over from this store: writes for them are refused."""
        self._run_sessions: dict[str, str] = {}
        self._call_runs: dict[int, str] = {}

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

    # ----------------------------------------------------------------- fencing
    def _known_session(self, *, run: str | None, call: int | None) -> str | None:
        """The session of ``run`` (or of ``call``'s run) if this store has seen it."""
        if call is not None and run is None:
            run = self._call_runs.get(call)
        return self._run_sessions.get(run) if run is not None else None

    def _session_of(self, tx: Tx, *, run: str | None, call: int | None) -> str | None:
        if call is not None and run is None:
            run = self._call_runs.get(call)
            if run is None:
                row = tx.execute("SELECT run_id FROM calls WHERE id = %s", (call,)).fetchone()
                run = row["run_id"] if row else None
        if run is None:
            return None
        session = self._run_sessions.get(run)
        if session is None:
            row = tx.execute("SELECT session_id FROM runs WHERE id = %s", (run,)).fetchone()
            session = row["session_id"] if row else None
            if session is not None:
                self._run_sessions[run] = session
        return session

    def _lease_lost(self, fence: Fence) -> LeaseLostError:
        """Record that another owner took ``fence.session`` over (writer thread)."""
        self._let_go(fence.session, lost=True)
        return LeaseLostError(fence.session, fence.owner)

    def _let_go(self, session: str, *, lost: bool) -> None:
        """``session``'s lease is no longer held (``lost``: another owner took it over).
        Lost before no longer held: a fence read on another thread in between finds it in
        one of the two, never in neither (then a write would go unfenced)."""
        if lost:
            self._lost.add(session)
        self._held.pop(session, None)

    def _fence(
        self, session: str | None, run: str | None, call: int | None
    ) -> Callable[[Tx], Fence | None] | None:
        """What a write to ``session`` (or ``run``'s or ``call``'s) must check: the lease
        this store holds on it (looked up when the write runs), or nothing."""
        if not (self._held or self._lost):
            return None
        known = session or self._known_session(run=run, call=call)
        if known is not None and known in self._lost:
            raise LeaseLostError(known, "this store")

        def fence(tx: Tx) -> Fence | None:
            target = known or self._session_of(tx, run=run, call=call)
            if target is None:
                return None
            if target in self._lost:
                raise LeaseLostError(target, "this store")
            owner = self._held.get(target)
            return Fence(target, owner) if owner is not None else None

        return fence

    async def _write(
        self,
        fn: Callable[[Tx], T],
        *,
        session: str | None = None,
        run: str | None = None,
        call: int | None = None,
    ) -> T:
        """Commit ``fn`` unless the session it writes to was taken over from this store."""
        return await self._connections.write(fn, self._fence(session, run, call))

    async def _write_later(
        self, fn: Callable[[Tx], Later[T]], *, run: str | None = None, session: str | None = None
    ) -> T:
        """``_write`` for statements whose result is read once the batch has run."""
        return await self._connections.write_later(fn, self._fence(session, run, None))

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
            self._held[session.id] = owner
            self._lost.discard(session.id)

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
        self._held[session_id] = owner
        self._lost.discard(session_id)

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

    # ----------------------------------------------------------------- messages & calls
    @staticmethod
    def _insert_messages(tx: Tx, values: list[dict[str, Any]]) -> None:
        tx.send_many(
            "INSERT INTO messages (run_id, seq, role, content, kind, created) VALUES "
            "(%(run_id)s, %(seq)s, %(role)s, %(content)s, %(kind)s, %(created)s)",
            values,
        )

    async def append_messages(self, messages: Sequence[MessageRecord]) -> None:
        """Commit messages in one transaction."""
        values = [message_row(m) for m in messages]
        if values:
            await self._write(lambda tx: self._insert_messages(tx, values), run=values[0]["run_id"])

    async def continue_run(self, run_id: str, messages: Sequence[MessageRecord]) -> None:
        """Reopen a finished run (a ``running`` row after its end: history stays) and
        append ``messages`` to it, in one transaction."""
        values = [message_row(m) for m in messages]
        reopened = {"run_id": run_id, "status": "running", "finished": time.time()}

        def write(tx: Tx) -> None:
            insert(tx, "run_ends", reopened)
            self._insert_messages(tx, values)

        await self._write(write, run=run_id)

    async def begin_call(
        self,
        call: CallRecord,
        messages: Sequence[MessageRecord],
        *,
        tool_event: ToolEventRecord | None = None,
        spills: Sequence[SpillRecord] = (),
    ) -> int:
        """Commit pending messages and the call row together, before the request is sent
        (after ``tool_event`` and ``spills``, if given: see the protocol)."""
        event = tool_event_row(tool_event) if tool_event is not None else None
        spill_values = [spill_row(s) for s in spills]
        values = [message_row(m) for m in messages]
        call_values = call_row(call)

        def write(tx: Tx) -> Later[int]:
            if event is not None:
                insert(tx, "tool_events", event)
            tx.send_many(SAVE_SPILL, spill_values)
            self._insert_messages(tx, values)
            return insert_id(tx, "calls", call_values)

        call_id = await self._write_later(write, run=call.run_id)
        self._call_runs[call_id] = call.run_id
        return call_id

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
        run_output: str | None = None,
    ) -> None:
        """Commit the call's outcome (and the assistant message, and the ``started`` events
        of the tool calls it asks for; with ``run_output`` the run's end) in one
        transaction."""
        message_values = [message_row(message)] if message else []
        events = [tool_event_row(e) for e in tool_events]
        outcome, end = call_outcome_rows(
            call_id,
            status=status,
            message=message,
            error_type=error_type,
            error=error,
            response_id=response_id,
            model=model,
            stop_reason=stop_reason,
            usage=usage,
            run_output=run_output,
        )

        def write(tx: Tx) -> None:
            self._insert_messages(tx, message_values)
            insert(tx, "call_outcomes", outcome)
            for event in events:
                insert(tx, "tool_events", event)
            if end is not None:
                insert(tx, "run_ends", end)

        await self._write(write, call=call_id)
        self._call_runs.pop(call_id, None)

    async def close_interrupted_calls(self, run_id: str) -> list[CallRecord]:
        """Record an ``interrupted`` outcome for every call of the run still in flight.

        Only the lease holder calls this on resume: no other process can have a call of
        this run in flight, so these are calls a crash cut off. Returns them.
        """

        def write(tx: Tx) -> list[CallRecord]:
            rows = tx.execute(
                self._CALL_SQL + " WHERE c.run_id = %s AND o.id IS NULL ORDER BY c.id", (run_id,)
            ).fetchall()
            now = time.time()
            for row in rows:
                insert(tx, "call_outcomes", interrupted_outcome_row(row["id"], now))
            return [CallRecord(**row) for row in rows]

        return await self._write(write, run=run_id)

    # ----------------------------------------------------------------- tools, snapshots
    async def record_tool_event(
        self,
        event: ToolEventRecord,
        *,
        spills: Sequence[SpillRecord] = (),
        messages: Sequence[MessageRecord] = (),
    ) -> None:
        """Commit a tool event, then ``spills`` and ``messages``, in one transaction."""
        values = tool_event_row(event)
        spill_values = [spill_row(s) for s in spills]
        message_values = [message_row(m) for m in messages]

        def write(tx: Tx) -> None:
            insert(tx, "tool_events", values)
            tx.send_many(SAVE_SPILL, spill_values)
            self._insert_messages(tx, message_values)

        await self._write(write, run=event.run_id)

    async def save_snapshot(self, snapshot: SnapshotRecord) -> None:
        values = snapshot_row(snapshot)
        await self._write(lambda tx: insert(tx, "snapshots", values), run=snapshot.run_id)

    async def add_boundary(
        self, boundary: BoundaryRecord, messages: Sequence[MessageRecord] = ()
    ) -> int:
        """Commit a boundary (and any messages that belong with it) atomically."""
        values = boundary_row(boundary)
        message_values = [message_row(m) for m in messages]

        def write(tx: Tx) -> Later[int]:
            self._insert_messages(tx, message_values)
            return insert_id(tx, "boundaries", values)

        return await self._write_later(write, run=boundary.run_id)

    async def save_spill(self, handle: str, run_id: str, call_id: str, content: str) -> None:
        """Keep ``content`` under ``handle`` (a second save of a handle keeps the first).

        A text equal to the call's finished tool event (a spilled output) is not stored a
        second time: the row refers to that event (``event_id``), in the same statement.
        """
        values = spill_row(SpillRecord(handle, run_id, call_id, content, time.time()))
        await self._write(lambda tx: tx.send(SAVE_SPILL, values), run=run_id)

    async def add_cache_break(
        self, run_id: str, call_id: int, cause: str, expected_read: int, actual_read: int
    ) -> None:
        values = cache_break_row(run_id, call_id, cause, expected_read, actual_read)
        await self._write(lambda tx: insert(tx, "cache_breaks", values), run=run_id)

    async def save_context_limit(self, limit: ContextLimitRecord) -> None:
        """Record a limit a channel taught (or that was configured), or a run's limit."""
        values = {
            "model": limit.model,
            "channel": limit.channel,
            "maximum": limit.maximum,
            "ratio": limit.ratio,
            '"window"': limit.window,
            "source": limit.source,
            "run_id": limit.run_id,
            "created": limit.created,
        }
        columns = ", ".join(values)
        marks = ", ".join("%s" for _ in values)
        await self._write(
            lambda tx: tx.send(
                f"INSERT INTO context_limits ({columns}) VALUES ({marks})", tuple(values.values())
            ),
            run=limit.run_id,
        )

    async def add_spend(self, spend: SpendRecord) -> None:
        """Commit one call's spend for a tenant (every process on the store sees it)."""
        values = asdict(spend)
        await self._write(lambda tx: insert(tx, "tenant_spend", values), run=spend.run_id)

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
