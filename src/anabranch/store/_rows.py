"""Records as column values, the same for every backend (the tables have the same columns)."""

from __future__ import annotations

import time
from typing import Any

from anabranch.store._records import (
    CallRecord,
    MessageRecord,
    RunRecord,
    SnapshotRecord,
    SpillRecord,
    ToolEventRecord,
)

__all__ = [
    "call_row",
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
