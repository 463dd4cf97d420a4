"""Records as column values, the same for every backend (the tables have the same columns)."""

from __future__ import annotations

import time
from typing import Any

from anabranch.store._records import (
    BoundaryRecord,
    CallRecord,
    MessageRecord,
    RunRecord,
    SnapshotRecord,
    SpillRecord,
    ToolEventRecord,
)

__all__ = [
    "boundary_row",
    "cache_break_row",
    "call_outcome_rows",
    "call_row",
    "interrupted_outcome_row",
    "message_row",
    "run_end_row",
    "run_row",
    "run_span_row",
    "session_event_row",
    "snapshot_row",
    "spill_row",
    "tool_event_row",
]


def message_row(message: MessageRecord) -> dict[str, Any]:
    return {
        "run_id": message.run_id,
        "seq": message.seq,
        "role": message.role,
        "content": message.content,
        "kind": message.kind,
        "created": message.created or time.time(),
    }


def run_end_row(
    run_id: str, output: str | None, status: str = "done", error: str | None = None
) -> dict[str, Any]:
    """A run's end (``finish_run``'s row, or an answer's committed with its call)."""
    return {
        "run_id": run_id,
        "status": status,
        "output": output,
        "error": error,
        "finished": time.time(),
    }


def tool_event_row(event: ToolEventRecord) -> dict[str, Any]:
    return {
        "run_id": event.run_id,
        "call_id": event.call_id,
        "name": event.name,
        "event": event.event,
        "content": event.content,
        "is_error": bool(event.is_error),
        "created": event.created,
        "attachments": event.attachments,
    }


def spill_row(spill: SpillRecord) -> dict[str, Any]:
    return {
        "handle": spill.handle,
        "run_id": spill.run_id,
        "call_id": spill.call_id,
        "content": spill.content,
        "created": spill.created,
    }


def snapshot_row(snapshot: SnapshotRecord) -> dict[str, Any]:
    return {
        "run_id": snapshot.run_id,
        "version": snapshot.version,
        "reason": snapshot.reason,
        "system": snapshot.system,
        "tools": snapshot.tools,
        "created": snapshot.created,
    }


def run_row(run: RunRecord) -> dict[str, Any]:
    return {
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


def call_row(call: CallRecord) -> dict[str, Any]:
    return {
        "run_id": call.run_id,
        "turn": call.turn,
        "attempt": call.attempt,
        "fingerprint": call.fingerprint,
        "message_count": call.message_count,
        "created": call.created,
        "snapshot_version": call.snapshot_version,
        "compactions": call.compactions,
        "settings": call.settings,
    }


def run_span_row(
    session_id: str, run_id: str, trace_id: str | bytes, span_id: str | bytes
) -> dict[str, Any]:
    """A drive's ``run_spans`` row: the trace and span id of its span (hex, or the bytes
    they spell where a backend keeps them so)."""
    return {
        "session_id": session_id,
        "run_id": run_id,
        "trace_id": trace_id,
        "span_id": span_id,
        "created": time.time(),
    }


def session_event_row(
    session_id: str, status: str, output: str | None = None, error: str | None = None
) -> dict[str, Any]:
    """A session's status change (``set_session_status``'s row)."""
    return {
        "session_id": session_id,
        "status": status,
        "output": output,
        "error": error,
        "created": time.time(),
    }


def call_outcome_rows(
    call_id: int,
    *,
    status: str,
    message: MessageRecord | None,
    error_type: str | None,
    error: str | None,
    response_id: str | None,
    model: str | None,
    stop_reason: str | None,
    usage: str | None,
    run_output: str | None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``finish_call``'s outcome row, and (for an answer that ends its run: ``message``
    with ``run_output``) the run's end row."""
    end = None
    if message is not None and run_output is not None:  # the answer ends its run
        end = run_end_row(message.run_id, run_output)
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
    return outcome, end


def interrupted_outcome_row(call_id: int, created: float) -> dict[str, Any]:
    """The outcome ``close_interrupted_calls`` records for a call still in flight."""
    return {
        "call_id": call_id,
        "status": "interrupted",
        "error": "the process stopped before the response was committed",
        "created": created,
    }


def boundary_row(boundary: BoundaryRecord) -> dict[str, Any]:
    """A boundary's row: its fields but the id (the database's) and ``details`` (not
    stored)."""
    return {
        name: getattr(boundary, name)
        for name in BoundaryRecord.__dataclass_fields__
        if name not in ("id", "details")
    }


def cache_break_row(
    run_id: str, call_id: int, cause: str, expected_read: int, actual_read: int
) -> dict[str, Any]:
    """A prompt-cache break of one call (``add_cache_break``'s row)."""
    return {
        "run_id": run_id,
        "call_id": call_id,
        "cause": cause,
        "expected_read": expected_read,
        "actual_read": actual_read,
        "created": time.time(),
    }
