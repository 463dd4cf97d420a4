"""``SQLiteHistoryWrites``: the writes of a run's history to the SQLite store, in one
transaction each: messages, calls and their outcomes, tool events, snapshots, boundaries
and spills (``SQLiteHistory`` holds the reads of them)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Coroutine, Sequence
from functools import partial
from typing import Any, Literal

from anabranch.store._records import (
    BoundaryRecord,
    CallRecord,
    MessageRecord,
    SnapshotRecord,
    SpillRecord,
    ToolEventRecord,
)
from anabranch.store._rows import (
    boundary_row,
    call_outcome_rows,
    interrupted_outcome_row,
    spill_row,
)
from anabranch.store.sqlite._blobs import dehydrate
from anabranch.store.sqlite._group_commit import GroupCommitConnection
from anabranch.store.sqlite._rows import (
    CALL_SQL,
    INSERT_CALL,
    INSERT_MESSAGE,
    INSERT_OUTCOME,
    INSERT_RUN_END,
    INSERT_TOOL_EVENT,
    call_record,
    call_values,
    fetch_rows,
    insert,
    message_row,
    snapshot_row,
    tool_event_row,
)

__all__ = ["SQLiteHistoryWrites"]

_SAVE_SPILL = """
    INSERT OR IGNORE INTO spills(handle, run_id, call_id, content, created, event_id)
    SELECT :handle, :run_id, :call_id, CASE WHEN e.id IS NULL THEN :content END, :created, e.id
    FROM (SELECT 1) LEFT JOIN (
        SELECT t.id FROM tool_events t
        WHERE t.run_id = :run_id AND t.call_id = :call_id AND t.event = 'finished'
          AND t.content = :content
        ORDER BY t.id DESC LIMIT 1) e
"""
"""A spill row: its text, or (when that is its call's finished event's) the event's id."""

Row = dict[str, Any]


def _begin_call(
    event: Row | None,
    spills: tuple[Row, ...],
    messages: tuple[Row, ...],
    call: Row,
    conn: sqlite3.Connection,
) -> int:
    """``begin_call``'s write: a tool event, spills, messages and the call row, in this
    order; the call's id.

    The hot writes are module functions bound with ``partial`` and their rows held in
    tuples: a write waiting for its batch then keeps two tracked objects of its own
    alive (the partial and its arguments), where a closure kept a function, its closure
    tuple, a cell per name and a list per group of rows (empty or not), all of which the
    young collections walk while the batch waits for the writer thread."""
    if event is not None:
        INSERT_TOOL_EVENT(conn, event)
    _spills_and_messages(spills, messages, conn)
    return INSERT_CALL(conn, call)


def _tool_event(
    event: Row, spills: tuple[Row, ...], messages: tuple[Row, ...], conn: sqlite3.Connection
) -> None:
    """``record_tool_event``'s write: the event, then spills and messages."""
    INSERT_TOOL_EVENT(conn, event)
    _spills_and_messages(spills, messages, conn)


def _spills_and_messages(
    spills: tuple[Row, ...], messages: tuple[Row, ...], conn: sqlite3.Connection
) -> None:
    for spill in spills:
        conn.execute(_SAVE_SPILL, dehydrate(conn, "spills", spill))
    for value in messages:
        INSERT_MESSAGE(conn, value)


def _finish_call(
    message: Row | None,
    outcome: Row,
    events: tuple[Row, ...],
    end: Row | None,
    conn: sqlite3.Connection,
) -> None:
    """``finish_call``'s write: the answer, its outcome, its tools' ``started`` events and
    (for an answer that ends its run) the run's end."""
    if message is not None:
        INSERT_MESSAGE(conn, message)
    INSERT_OUTCOME(conn, outcome)
    for event in events:
        INSERT_TOOL_EVENT(conn, event)
    if end is not None:
        INSERT_RUN_END(conn, end)


class SQLiteHistoryWrites:
    """Mixed into ``SQLiteStore``: a run's history, written through the group commit."""

    _sql: GroupCommitConnection

    async def append_messages(self, messages: Sequence[MessageRecord]) -> None:
        """Commit messages in one transaction."""
        values = [message_row(m) for m in messages]

        def write(conn: sqlite3.Connection) -> None:
            for value in values:
                insert(conn, "messages", value)

        if values:
            await self._sql.write(write)

    async def continue_run(self, run_id: str, messages: Sequence[MessageRecord]) -> None:
        """Reopen a finished run and append ``messages`` to it, in one transaction."""
        values = [message_row(m) for m in messages]

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM run_ends WHERE run_id = ?", (run_id,))
            for value in values:
                insert(conn, "messages", value)

        await self._sql.write(write)

    def begin_call(
        self,
        call: CallRecord,
        messages: Sequence[MessageRecord],
        *,
        tool_event: ToolEventRecord | None = None,
        spills: Sequence[SpillRecord] = (),
    ) -> Coroutine[Any, Any, int]:
        """Commit pending messages and the call row together, before the request is sent
        (after ``tool_event`` and ``spills``, if given: see the protocol). (A plain
        function returning the group commit's coroutine, as ``finish_call`` and
        ``record_tool_event``: a write in flight holds no frame of the store's.)"""
        event = tool_event_row(tool_event) if tool_event is not None else None
        return self._sql.write(
            partial(
                _begin_call,
                event,
                tuple(map(spill_row, spills)) if spills else (),
                tuple(map(message_row, messages)) if messages else (),
                call_values(call),
            )
        )

    def finish_call(
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
    ) -> Coroutine[Any, Any, None]:
        """Commit the call's outcome (and the assistant message, and the ``started`` events
        of the tool calls it asks for; with ``run_output`` the run's end) in one
        transaction."""
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
        return self._sql.write(
            partial(
                _finish_call,
                message_row(message) if message else None,
                outcome,
                tuple(map(tool_event_row, tool_events)) if tool_events else (),
                end,
            )
        )

    async def close_interrupted_calls(self, run_id: str) -> list[CallRecord]:
        """Record an ``interrupted`` outcome for every call of the run still in flight.

        Only the lease holder calls this on resume: no other process can have a call of
        this run in flight, so these are calls a crash cut off. Returns them.
        """

        def write(conn: sqlite3.Connection) -> list[CallRecord]:
            rows = fetch_rows(
                conn,
                CALL_SQL + " WHERE c.run_id = ? AND o.call_id IS NULL ORDER BY c.id",
                (run_id,),
            )
            now = time.time()
            for row in rows:
                insert(conn, "call_outcomes", interrupted_outcome_row(row["id"], now))
            return [call_record(row) for row in rows]

        return await self._sql.write(write)

    def record_tool_event(
        self,
        event: ToolEventRecord,
        *,
        spills: Sequence[SpillRecord] = (),
        messages: Sequence[MessageRecord] = (),
    ) -> Coroutine[Any, Any, None]:
        """Commit a tool event, then ``spills`` and ``messages``, in one transaction."""
        return self._sql.write(
            partial(
                _tool_event,
                tool_event_row(event),
                tuple(map(spill_row, spills)) if spills else (),
                tuple(map(message_row, messages)) if messages else (),
            )
        )

    async def save_snapshot(self, snapshot: SnapshotRecord) -> None:
        values = snapshot_row(snapshot)
        await self._sql.write(lambda conn: insert(conn, "snapshots", values))

    async def add_boundary(
        self, boundary: BoundaryRecord, messages: Sequence[MessageRecord] = ()
    ) -> int:
        """Commit a boundary (and any messages that belong with it) atomically."""
        values = boundary_row(boundary)
        message_values = [message_row(m) for m in messages]

        def write(conn: sqlite3.Connection) -> int:
            for value in message_values:
                insert(conn, "messages", value)
            return insert(conn, "boundaries", values)

        return await self._sql.write(write)

    async def save_spill(self, handle: str, run_id: str, call_id: str, content: str) -> None:
        """Keep ``content`` under ``handle`` (a second save of a handle keeps the first).

        A text equal to the call's finished tool event (a spilled output) is not stored a
        second time: the row refers to that event (``event_id``), in the same transaction.
        """
        values = spill_row(SpillRecord(handle, run_id, call_id, content, time.time()))

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(_SAVE_SPILL, dehydrate(conn, "spills", values))  # an image: a blob

        await self._sql.write(write)
