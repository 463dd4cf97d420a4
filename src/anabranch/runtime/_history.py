"""A run's history: the one place domain objects and store records are converted.

Records carry JSON text (the store knows nothing of messages); this module turns messages,
prompt snapshots, boundaries and tool events into records and back, and reads a
boundary's context (its prefix plus the message ranges it keeps) from the store. Nothing
else parses a record's JSON fields.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import pydantic

from anabranch.messages import (
    Attachment,
    Document,
    Image,
    Message,
    SystemBlock,
    ToolDefinition,
    Usage,
    canonical_json,
    messages_from_json,
)
from anabranch.store import (
    BoundaryRecord,
    CallRecord,
    MessageRecord,
    SessionRecord,
    SnapshotRecord,
    Store,
)

__all__ = [
    "usage_anchor",
    "Ranges",
    "attachments_from_json",
    "attachments_json",
    "boundary_extra",
    "boundary_prefix",
    "boundary_ranges",
    "call_usage",
    "context_for",
    "exchange_turns",
    "message_from_record",
    "message_json",
    "message_records",
    "session_outline",
    "snapshot_blocks",
    "snapshot_record",
]

Ranges = list[list[int | None]]
"""A boundary's ``[first_seq, last_seq_or_None]`` ranges of original messages."""

_ATTACHMENTS: pydantic.TypeAdapter[list[Attachment]] = pydantic.TypeAdapter(list[Attachment])
_SYSTEM: pydantic.TypeAdapter[list[SystemBlock]] = pydantic.TypeAdapter(list[SystemBlock])
_TOOLS: pydantic.TypeAdapter[list[ToolDefinition]] = pydantic.TypeAdapter(list[ToolDefinition])


# ---------------------------------------------------------------------- messages
def message_json(message: Message) -> str:
    """A message's content as the canonical JSON a ``MessageRecord`` stores."""
    return canonical_json(message.model_dump(mode="json")["content"])


def message_from_record(record: MessageRecord) -> Message:
    """The message a record stores."""
    # pydantic parses the stored JSON itself: ~6x faster than json.loads + model_validate
    return Message.model_validate_json(
        f'{{"role":{json.dumps(record.role)},"content":{record.content}}}'
    )


def message_records(
    run_id: str, first_seq: int, messages: Sequence[Message], kind: str = "message"
) -> list[MessageRecord]:
    """Records for ``messages``, numbered from ``first_seq``."""
    now = time.time()
    return [
        MessageRecord(
            run_id=run_id,
            seq=first_seq + offset,
            role=message.role,
            content=message_json(message),
            kind=kind,
            created=now,
        )
        for offset, message in enumerate(messages)
    ]


def attachments_json(attachments: Sequence[Image | Document]) -> str | None:
    """A tool event's attachments as stored (None when there are none)."""
    if not attachments:
        return None
    return _ATTACHMENTS.dump_json(list(attachments)).decode()


def attachments_from_json(text: str | None) -> tuple[Image | Document, ...]:
    """The attachments a tool event stores."""
    return tuple(_ATTACHMENTS.validate_json(text)) if text else ()


def exchange_turns(context: Sequence[Message]) -> int | None:
    """Assistant turns since the latest user message sent into a conversation (a text
    turn after the first message, not tool results); None before any such message."""
    for index in range(len(context) - 1, 0, -1):
        message = context[index]
        if message.role == "user" and not message.tool_results and message.text:
            return sum(1 for m in context[index + 1 :] if m.role == "assistant")
    return None


# ---------------------------------------------------------------------- snapshots
def snapshot_blocks(
    snapshot: SnapshotRecord,
) -> tuple[tuple[SystemBlock, ...], tuple[ToolDefinition, ...]]:
    """The system blocks and tool definitions a prompt snapshot stores."""
    return tuple(_SYSTEM.validate_json(snapshot.system)), tuple(
        _TOOLS.validate_json(snapshot.tools)
    )


def snapshot_record(
    run_id: str,
    version: int,
    system: Sequence[SystemBlock],
    tools: Sequence[ToolDefinition],
    *,
    reason: str,
) -> SnapshotRecord:
    """The record of a prompt snapshot (canonical JSON: the same blocks, the same bytes)."""
    return SnapshotRecord(
        run_id=run_id,
        version=version,
        system=canonical_json([b.model_dump(mode="json") for b in system]),
        tools=canonical_json([t.model_dump(mode="json") for t in tools]),
        created=time.time(),
        reason=reason,
    )


# ---------------------------------------------------------------------- calls
def call_usage(call: CallRecord) -> Usage:
    """The usage a call's outcome recorded (zero while it has none)."""
    return Usage.model_validate_json(call.usage) if call.usage else Usage()


# ---------------------------------------------------------------------- sessions
def session_outline(session: SessionRecord) -> dict[str, Any]:
    """The structure of a session's definition (agents, or a graph's tasks), as recorded."""
    if not session.definition:
        return {}
    outline = json.loads(session.definition)
    return outline if isinstance(outline, dict) else {}


# ---------------------------------------------------------------------- boundaries
def boundary_ranges(boundary: BoundaryRecord | None) -> Ranges:
    """The original message ranges a boundary keeps (everything without one)."""
    if boundary is None:
        return [[0, None]]
    return [list(r) for r in json.loads(boundary.ranges)]


def boundary_prefix(boundary: BoundaryRecord) -> tuple[Message, ...]:
    """The messages that open the context a boundary describes (e.g. the summary)."""
    return tuple(messages_from_json(boundary.prefix))


def boundary_extra(boundary: BoundaryRecord) -> dict[str, Any]:
    """A boundary's extra details (empty when it has none or they do not parse)."""
    if not boundary.extra:
        return {}
    try:
        extra = json.loads(boundary.extra)
    except ValueError:
        return {}
    return extra if isinstance(extra, dict) else {}


async def context_for(
    store: Store, run_id: str, prefix: str, ranges: Ranges
) -> tuple[list[Message], list[MessageRecord]]:
    """The messages a boundary's ``prefix`` and ``ranges`` stand for, and the records of
    the original messages among them."""
    messages = list(messages_from_json(prefix))
    records: list[MessageRecord] = []
    for first, last in ranges:
        assert first is not None
        records += await store.load_messages(run_id, from_seq=first, to_seq=last)
    messages.extend(message_from_record(r) for r in records)
    return messages, records


def usage_anchor(
    calls: Sequence[CallRecord],
    records: Sequence[MessageRecord],
    boundary_created: float | None,
) -> tuple[Usage, list[Message]] | None:
    """What a resumed run anchors its token accounting on, as the live run did: the last
    committed response's usage and the messages appended since, so it makes the same
    compaction decisions as an uninterrupted run (``None``: no anchor)."""
    last = next(
        (c for c in reversed(calls) if c.status == "ok" and c.message_seq is not None), None
    )
    if last is None or last.usage is None or last.message_seq is None:
        return None
    if boundary_created is not None and (last.finished or 0.0) < boundary_created:
        return None  # compacted since: the live run had dropped its anchor too
    if not any(r.seq == last.message_seq for r in records):
        return None
    return call_usage(last), [message_from_record(r) for r in records if r.seq > last.message_seq]
