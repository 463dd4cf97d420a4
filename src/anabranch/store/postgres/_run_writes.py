"""``RunWrites``: the writes of ``PostgresStore`` within a run, each fenced by the run's
session: its messages, calls and their outcomes, tool events, snapshots, boundaries,
spills, cache breaks, context limits and spend."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, Literal

from anabranch.store._records import (
    BoundaryRecord,
    CallRecord,
    ContextLimitRecord,
    MessageRecord,
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
    snapshot_row,
    spill_row,
    tool_event_row,
)
from anabranch.store.postgres._connection import Later, Tx
from anabranch.store.postgres._fencing import FencedWrites
from anabranch.store.postgres._statements import SAVE_SPILL, insert, insert_id

__all__ = ["RunWrites"]


class RunWrites(FencedWrites):
    """A run's history and accounting, written through ``_write``; ``PostgresStore`` adds
    sessions, leases and runs."""

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
