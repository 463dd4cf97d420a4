"""``Store``: what the runtime needs of a durable store, whatever the backend.

A backend keeps append-only history tables and commits every write atomically (a write
returns only once it is durable). Every failure of the backend itself surfaces as
``anabranch.errors.StoreError`` (``DatabaseError`` when opening), never as the driver's own
exception; a failed write leaves nothing. The runtime depends on this protocol, never on a
backend class; the conformance suite in ``tests/store_conformance`` is what every backend
must pass (its package docstring says how to add a backend to it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from anabranch.store._records import (
    BoundaryRecord,
    CallRecord,
    CallUsageSum,
    ContextLimitRecord,
    HistoryHit,
    MessageRecord,
    RunRecord,
    RunStatus,
    SessionBudgetRecord,
    SessionRecord,
    SnapshotRecord,
    SpendRecord,
    SpendTotal,
    SpillRecord,
    ToolEventRecord,
)

__all__ = ["Store"]


@runtime_checkable
class Store(Protocol):
    """An open store. Obtain one from a backend (``SQLiteStore.open``) and ``close`` it."""

    async def close(self) -> None: ...

    async def create_session(
        self, session: SessionRecord, *, owner: str | None = None, ttl: float = 0.0
    ) -> None:
        """Commit a new session, recorded ``running``. With ``owner``: its lease too, taken
        by ``owner`` for ``ttl`` seconds, and the session recorded ``running`` under it, in
        the same transaction (as ``acquire_lease(..., running=True)`` right after)."""
        ...

    async def set_session_status(
        self,
        session_id: str,
        status: RunStatus,
        *,
        output: str | None = None,
        error: str | None = None,
    ) -> None: ...

    async def get_session(self, session_id: str) -> SessionRecord | None: ...

    async def list_sessions(self, limit: int = 100) -> list[SessionRecord]: ...

    async def acquire_lease(
        self, session_id: str, owner: str, ttl: float, *, running: bool = False
    ) -> None:
        """Take the session's lease, or raise ``SessionBusyError`` if a live owner has it.
        ``running``: record the session ``running`` too (as ``set_session_status``), in
        the same transaction."""
        ...

    async def renew_lease(self, session_id: str, owner: str, ttl: float) -> bool:
        """Extend the lease; False if ``owner`` no longer holds it (another process took
        it over after it expired)."""
        ...

    async def release_lease(
        self,
        session_id: str,
        owner: str,
        *,
        status: RunStatus | None = None,
        output: str | None = None,
        error: str | None = None,
    ) -> None:
        """Give the lease up. With ``status``: record the session's end first (as
        ``set_session_status``), in the same transaction."""
        ...

    async def lease_holder(self, session_id: str) -> str | None:
        """The live owner of the session's lease, if any."""
        ...

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
        so a crash never leaves a run without its task. ``span``: the (hex) trace and span
        id of its first drive, committed in the same transaction as ``add_run_span`` would
        (a drive that starts the run writes once, and its resume link is never lost).
        ``call``: the row of the run's first model call, committed last in the same
        transaction as ``begin_call(call, ())`` would (the write-ahead of a first call
        built with no await); returns its id (0 without ``call``)."""
        ...

    async def finish_run(
        self, run_id: str, status: RunStatus, *, output: str | None = None, error: str | None = None
    ) -> None: ...

    async def get_run(self, run_id: str) -> RunRecord | None: ...

    async def list_runs(self, session_id: str) -> list[RunRecord]: ...

    async def find_child_run(self, parent_run_id: str, parent_call_id: str) -> RunRecord | None: ...

    async def append_messages(self, messages: Sequence[MessageRecord]) -> None:
        """Commit messages in one transaction."""
        ...

    async def continue_run(self, run_id: str, messages: Sequence[MessageRecord]) -> None:
        """Reopen a finished run (its status is ``running`` again) and append ``messages``,
        atomically: a conversation's next turn."""
        ...

    async def begin_call(
        self,
        call: CallRecord,
        messages: Sequence[MessageRecord],
        *,
        tool_event: ToolEventRecord | None = None,
        spills: Sequence[SpillRecord] = (),
    ) -> int:
        """Commit pending messages and the call row together, before the request is sent;
        its id. With ``tool_event``: that event, then ``spills``, then the messages and the
        call row, in one transaction (a tool turn's last result, its results message and
        the next call: as ``record_tool_event`` would, then the call)."""
        ...

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
        of the tool calls it asks for) in one transaction. ``run_output`` (with
        ``message``): the answer that ends its run, ``done`` as ``finish_run`` records it,
        in that transaction too."""
        ...

    async def close_interrupted_calls(self, run_id: str) -> list[CallRecord]:
        """Record an ``interrupted`` outcome for every call of the run still in flight."""
        ...

    async def load_messages(
        self, run_id: str, *, from_seq: int = 0, to_seq: int | None = None
    ) -> list[MessageRecord]: ...

    async def next_seq(self, run_id: str) -> int: ...

    async def list_calls(self, run_id: str) -> list[CallRecord]: ...

    async def recent_ok_calls(self, run_id: str, *, up_to: int, limit: int = 2) -> list[CallRecord]:
        """The run's last ``limit`` successful calls with id <= ``up_to``, newest first."""
        ...

    async def last_call(self, run_id: str, *, ok: bool = False) -> CallRecord | None:
        """The run's latest call (with ``ok``: latest successful one), read from the end of
        the (run_id, turn) index: a run's calls are numbered by turn in id order."""
        ...

    async def count_calls(self, run_id: str, status: str = "ok") -> int:
        """How many of the run's call attempts ended with ``status`` (no rows loaded)."""
        ...

    async def last_ok_turn(self, run_id: str) -> int:
        """The turn of the run's latest successful call (0 if none). A run's successful calls
        are turns 1..n, so this is their count, read from the end of the (run_id, turn)
        index instead of counting the whole history."""
        ...

    async def sum_call_usage(
        self, session_id: str, keys: Sequence[str], *, run_id: str | None = None
    ) -> dict[str, int]:
        """Sums of integer ``keys`` of the usage JSON of the session's (or run's) successful
        calls, computed in SQL: a long session's usage costs no rows in Python."""
        ...

    async def call_usage_by_run(
        self, session_id: str, keys: Sequence[str], *, up_to: int | None = None
    ) -> list[CallUsageSum]:
        """Per run and model, sums of integer ``keys`` of the usage JSON of the session's
        successful calls (with ``up_to``: those with id <= it), computed in SQL (what a
        resumed session has spent, without a row per call in Python); ordered by run id,
        then model."""
        ...

    async def last_call_id(self) -> int:
        """The highest call id in the store (0 if none): a call begun after this is read
        gets a higher one."""
        ...

    async def session_calls(self, session_id: str) -> list[CallRecord]: ...

    async def record_tool_event(
        self,
        event: ToolEventRecord,
        *,
        spills: Sequence[SpillRecord] = (),
        messages: Sequence[MessageRecord] = (),
    ) -> None:
        """Commit a tool event, then ``spills`` and ``messages``, in one transaction (the
        last result of a tool turn with the turn's spilled outputs and results message: a
        spill equal to the event's text refers to it, as ``save_spill`` would)."""
        ...

    async def tool_events(self, run_id: str, call_ids: Sequence[str]) -> list[ToolEventRecord]: ...

    async def session_tool_events(
        self, session_id: str, events: Sequence[str]
    ) -> list[ToolEventRecord]:
        """Every tool event of one of the ``events`` kinds in the session, oldest first
        (e.g. pending approvals)."""
        ...

    async def save_snapshot(self, snapshot: SnapshotRecord) -> None: ...

    async def latest_snapshot(self, run_id: str) -> SnapshotRecord | None: ...

    async def get_snapshot(self, run_id: str, version: int) -> SnapshotRecord | None: ...

    async def list_snapshots(self, run_id: str) -> list[SnapshotRecord]:
        """Every snapshot of a run, oldest first."""
        ...

    async def add_boundary(
        self, boundary: BoundaryRecord, messages: Sequence[MessageRecord] = ()
    ) -> int:
        """Commit a boundary (and any messages that belong with it) atomically."""
        ...

    async def list_boundaries(
        self, *, run_id: str | None = None, session_id: str | None = None
    ) -> list[BoundaryRecord]: ...

    async def get_boundary(self, boundary_id: int) -> BoundaryRecord | None: ...

    async def count_boundaries(self, run_id: str, status: str = "ok") -> int: ...

    async def latest_boundary(self, run_id: str) -> BoundaryRecord | None: ...

    async def save_spill(self, handle: str, run_id: str, call_id: str, content: str) -> None: ...

    async def get_spill(self, handle: str) -> str | None: ...

    async def get_spill_record(self, handle: str) -> SpillRecord | None:
        """The spill behind ``handle`` with the run that saved it."""
        ...

    async def search_history(self, run_id: str, text: str, limit: int = 5) -> list[HistoryHit]:
        """Full-text matches of ``text``'s words in one run's original messages and spills."""
        ...

    async def add_cache_break(
        self, run_id: str, call_id: int, cause: str, expected_read: int, actual_read: int
    ) -> None: ...

    async def list_cache_breaks(self, session_id: str) -> list[dict[str, Any]]: ...

    async def add_run_span(self, session_id: str, run_id: str, trace_id: str, span_id: str) -> None:
        """Remember the (hex) trace and span id of one drive of a run (for a graph's own
        span, ``run_id`` is the session id)."""
        ...

    async def run_spans(self, run_id: str, limit: int | None = None) -> list[tuple[str, str]]:
        """``(trace_id, span_id)`` of the earlier drives of a run (the latest ``limit`` of
        them, if given), oldest first."""
        ...

    async def save_context_limit(self, limit: ContextLimitRecord) -> None:
        """Record a limit a channel taught (or that was configured), or a run's limit."""
        ...

    async def context_limit(self, model: str, channel: str) -> ContextLimitRecord | None:
        """The latest limit taught for ``model`` on ``channel`` (rows without a run)."""
        ...

    async def run_context_limits(self, session_id: str) -> list[ContextLimitRecord]:
        """The limits the session's runs started with or learned, oldest first."""
        ...

    async def add_spend(self, spend: SpendRecord) -> None:
        """Commit one call's spend for a tenant (every process on the store sees it)."""
        ...

    async def tenant_spend(self, tenant: str, since: float) -> SpendTotal:
        """The tenant's spend recorded at or after ``since`` (epoch seconds), summed in
        the database."""
        ...

    async def set_session_budget(self, record: SessionBudgetRecord) -> None:
        """Record the budget (and tenant) a session runs under from now on."""
        ...

    async def session_budget(self, session_id: str) -> SessionBudgetRecord | None:
        """The latest budget record of the session, if it has one."""
        ...
