"""A run's history: the one place domain objects and store records are converted.

Records carry JSON text (the store knows nothing of messages); this module turns messages,
prompt snapshots, boundaries and tool events into records and back, and reads a
boundary's context (its prefix plus the message ranges it keeps) from the store. Nothing
else parses a record's JSON fields.

A finished tool's output is stored once, in its ``finished`` tool event: a message block
that is exactly the result that event holds is stored as a reference,
``{"type":"tool_result","tool_use_id":<call id>,"ref":"tool_event"}``, and reading puts the
result back (one batched tool-event query per read, never one per block). A result the
context pipeline changed on the way in (cut, spilled) is stored as it was sent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic

from anabranch._memo import IdentityMemo
from anabranch._text import json_string
from anabranch.agents._tools import Pin
from anabranch.context._budget import spill_handle
from anabranch.errors import StoreError
from anabranch.messages import (
    Attachment,
    Document,
    Image,
    Message,
    SystemBlock,
    ToolDefinition,
    ToolResultBlock,
    Usage,
    canonical_json,
    message_content_json,
    messages_from_json,
)
from anabranch.store import (
    BoundaryRecord,
    CallRecord,
    MessageRecord,
    SessionRecord,
    SnapshotRecord,
    Store,
    ToolEventRecord,
)

__all__ = [
    "TOOL_EVENT_REF",
    "Committed",
    "usage_anchor",
    "usage_json",
    "Ranges",
    "attachments_from_json",
    "attachments_json",
    "boundary_extra",
    "boundary_prefix",
    "pin_handle",
    "pin_record",
    "pinned_items",
    "prompt_json",
    "PinnedItem",
    "boundary_ranges",
    "call_usage",
    "outline_from",
    "tool_event_payload",
    "context_for",
    "exchange_turns",
    "load_messages",
    "message_json",
    "message_records",
    "messages_for",
    "result_from_event",
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
TOOL_EVENT_REF = "tool_event"
"""The ``ref`` of a stored tool_result block whose result is its call's finished event."""
_REF_MARK = '"ref":"tool_event"'
"""What a stored message holding a reference contains (canonical JSON: no spaces)."""
_REF_BATCH = 500
"""Call ids per tool-event query (well under any backend's bound-parameter limit)."""

Committed = Mapping[str, ToolResultBlock]
"""Call id -> the result block its committed ``finished`` event stands for."""


def result_from_event(event: ToolEventRecord) -> ToolResultBlock:
    """The result block a ``finished`` tool event stands for."""
    return ToolResultBlock(
        tool_use_id=event.call_id,
        content=event.content or "",
        is_error=event.is_error,
        attachments=attachments_from_json(event.attachments),
    )


def message_json(message: Message, committed: Committed | None = None) -> str:
    """A message's content as the canonical JSON a ``MessageRecord`` stores: each tool
    result that is exactly its committed event's (``committed``) as a reference to it.
    Without one, the message's own encoding (computed once per message object)."""
    if not committed:
        return message_content_json(message)
    refs: list[str] = []
    for block in message.content:  # the usual turn: every block a result as committed
        if type(block) is not ToolResultBlock:
            break
        found = committed.get(block.tool_use_id)
        if found is not block and (found is None or found != block):
            break
        refs.append(_ref_json(block.tool_use_id))
    else:
        return "[" + ",".join(refs) + "]" if refs else message_content_json(message)
    results = [_as_committed(block, committed) for block in message.content]
    if not any(results):
        return message_content_json(message)
    if all(results):  # every block a result as committed (a turn's tool results)
        return "[" + ",".join([_ref_json(r.tool_use_id) for r in results if r]) + "]"
    content: list[Any] = message.model_dump(mode="json")["content"]
    for index, result in enumerate(results):
        if result is not None:
            content[index] = {
                "type": "tool_result",
                "tool_use_id": result.tool_use_id,
                "ref": TOOL_EVENT_REF,
            }
    return canonical_json(content)


def _as_committed(block: object, committed: Committed) -> ToolResultBlock | None:
    """``block`` if it is a tool result exactly as its finished event holds it."""
    if not isinstance(block, ToolResultBlock):
        return None
    found = committed.get(block.tool_use_id)
    return block if found is block or (found is not None and found == block) else None


def _ref_json(call_id: str) -> str:
    """The stored reference to a call's result: ``canonical_json`` of
    ``{"type": "tool_result", "tool_use_id": call_id, "ref": TOOL_EVENT_REF}``."""
    return f'{{"ref":"{TOOL_EVENT_REF}","tool_use_id":{json_string(call_id)},"type":"tool_result"}}'


def _parse(record: MessageRecord) -> Message:
    # pydantic parses the stored JSON itself: ~6x faster than json.loads + model_validate
    return Message.model_validate_json(
        f'{{"role":{json.dumps(record.role)},"content":{record.content}}}'
    )


def _is_ref(block: Any) -> bool:
    return (
        isinstance(block, dict)
        and block.get("type") == "tool_result"
        and block.get("ref") == TOOL_EVENT_REF
    )


async def messages_for(store: Store, records: Sequence[MessageRecord]) -> list[Message]:
    """The messages ``records`` store, each tool-event reference resolved (one batched
    query per run).

    Raises:
        StoreError: a reference to a tool call that has no finished event.
    """
    parsed: dict[int, list[Any]] = {}
    wanted: dict[str, set[str]] = {}
    for index, record in enumerate(records):
        if _REF_MARK not in record.content:
            continue
        blocks = json.loads(record.content)
        refs = (
            [str(b.get("tool_use_id")) for b in blocks if _is_ref(b)]
            if isinstance(blocks, list)
            else []
        )
        if refs:
            parsed[index] = blocks
            wanted.setdefault(record.run_id, set()).update(refs)
    results: dict[tuple[str, str], ToolResultBlock] = {}
    for run_id, call_ids in wanted.items():
        ordered = sorted(call_ids)
        for start in range(0, len(ordered), _REF_BATCH):
            events = await store.tool_events(run_id, ordered[start : start + _REF_BATCH])
            for event in events:  # in commit order: the latest finished event wins, as in
                if event.event == "finished":  # the loop that wrote the reference
                    results[(run_id, event.call_id)] = result_from_event(event)
    messages: list[Message] = []
    for index, record in enumerate(records):
        blocks = parsed.get(index)
        if blocks is None:
            messages.append(_parse(record))
            continue
        content: list[Any] = []
        for block in blocks:
            if _is_ref(block):
                result = results.get((record.run_id, str(block.get("tool_use_id"))))
                if result is None:
                    raise StoreError(
                        f"message {record.seq} of run {record.run_id} refers to the result "
                        f"of tool call {block.get('tool_use_id')!r}, which has no finished event"
                    )
                content.append(result)
            else:
                content.append(block)
        messages.append(Message.model_validate({"role": record.role, "content": content}))
    return messages


async def load_messages(
    store: Store, run_id: str, *, from_seq: int = 0, to_seq: int | None = None
) -> tuple[list[MessageRecord], list[Message]]:
    """A run's stored messages (records, and the messages they stand for) in seq order."""
    records = await store.load_messages(run_id, from_seq=from_seq, to_seq=to_seq)
    return records, await messages_for(store, records)


def message_records(
    run_id: str,
    first_seq: int,
    messages: Sequence[Message],
    kind: str = "message",
    committed: Committed | None = None,
) -> list[MessageRecord]:
    """Records for ``messages``, numbered from ``first_seq`` (``committed``: see
    ``message_json``)."""
    now = time.time()
    return [
        MessageRecord(
            run_id=run_id,
            seq=first_seq + offset,
            role=message.role,
            content=message_json(message, committed),
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
    system_json, tools_json = prompt_json(system, tools)
    return SnapshotRecord(
        run_id=run_id,
        version=version,
        system=system_json,
        tools=tools_json,
        created=time.time(),
        reason=reason,
    )


_PROMPT_JSON: IdentityMemo[tuple[str, str]] = IdentityMemo(limit=256)


def prompt_json(system: Sequence[SystemBlock], tools: Sequence[ToolDefinition]) -> tuple[str, str]:
    """The canonical JSON a snapshot stores of ``system`` and ``tools``, computed once while
    they are the same objects (the runs of one agent share theirs: ``_run_prompt``)."""
    return _PROMPT_JSON.get((system, tools), _prompt_json)


def _prompt_json(
    system: Sequence[SystemBlock], tools: Sequence[ToolDefinition]
) -> tuple[str, str]:
    return (
        canonical_json([b.model_dump(mode="json") for b in system]),
        canonical_json([t.model_dump(mode="json") for t in tools]),
    )


# ---------------------------------------------------------------------- calls
_USAGE_FIELDS = tuple(sorted(Usage.model_fields))
"""``Usage``'s fields in the order canonical JSON writes them (every default is 0)."""


def usage_json(usage: Usage) -> str:
    """A call's usage as stored: the counts that are not zero (reading fills in zeros).

    Written out directly (one per model call): the text ``canonical_json`` gives for the
    non-default counts, a count that is not a plain ``int`` taking that way itself."""
    values = usage.__dict__
    parts = []
    for name in _USAGE_FIELDS:
        count = values[name]
        if type(count) is not int:
            return canonical_json(usage.model_dump(mode="json", exclude_defaults=True))
        if count:
            parts.append(f'"{name}":{count}')
    return "{" + ",".join(parts) + "}"


def call_usage(call: CallRecord) -> Usage:
    """The usage a call's outcome recorded (zero while it has none)."""
    return Usage.model_validate_json(call.usage) if call.usage else Usage()


# ---------------------------------------------------------------------- sessions
def session_outline(session: SessionRecord) -> dict[str, Any]:
    """The structure of a session's definition (agents, or a graph's tasks), as recorded."""
    return outline_from(session.definition)


def outline_from(definition: str | None) -> dict[str, Any]:
    """A recorded definition outline ({} when there is none or it does not parse)."""
    if not definition:
        return {}
    try:
        outline = json.loads(definition)
    except ValueError:
        return {}
    return outline if isinstance(outline, dict) else {}


# ---------------------------------------------------------------------- tool events
def tool_event_payload(event: ToolEventRecord) -> dict[str, Any]:
    """The JSON object a tool event carries (approval requests and decisions): {} if none."""
    if not event.content:
        return {}
    try:
        payload = json.loads(event.content)
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}


# ---------------------------------------------------------------------- boundaries
def boundary_ranges(boundary: BoundaryRecord | None) -> Ranges:
    """The original message ranges a boundary keeps (everything without one)."""
    if boundary is None:
        return [[0, None]]
    return [list(r) for r in json.loads(boundary.ranges)]


@dataclass(frozen=True)
class PinnedItem:
    """A pin as committed: which call made it, its label and its recall handle."""

    call_id: str
    handle: str
    label: str
    index: int
    """The pin's position among its call's pins."""
    source: str
    """``result`` (a ``pin=True`` tool's result) or ``pin`` (``ToolContext.pin``)."""
    created: float


def pin_handle(run_id: str, call_id: str, index: int) -> str:
    """The recall handle of a call's ``index``-th pin (stable across a re-run)."""
    return spill_handle(run_id, f"{call_id}#pin{index}")


def pin_record(
    run_id: str, call_id: str, handle: str, pin: Pin, index: int, *, source: str
) -> BoundaryRecord:
    """The row that records one pin (kind ``pin``: no context layout, never ``ok``)."""
    return BoundaryRecord(
        run_id=run_id,
        kind="pin",
        prefix="[]",
        ranges="[]",
        created=time.time(),
        status="pinned",
        extra=json.dumps(
            {
                "call_id": call_id,
                "handle": handle,
                "label": pin.label,
                "index": index,
                "source": source,
            }
        ),
    )


def pinned_items(boundaries: Sequence[BoundaryRecord]) -> list[PinnedItem]:
    """The run's pins in the order they were made (a call run again after a crash pins
    again under the same handles: each handle once, at its latest)."""
    found: dict[str, PinnedItem] = {}
    for boundary in boundaries:
        if boundary.kind != "pin":
            continue
        extra = boundary_extra(boundary)
        handle, call_id = extra.get("handle"), extra.get("call_id")
        if not isinstance(handle, str) or not isinstance(call_id, str):
            continue
        found.pop(handle, None)
        found[handle] = PinnedItem(
            call_id=call_id,
            handle=handle,
            label=str(extra.get("label") or handle),
            index=int(extra.get("index") or 0),
            source=str(extra.get("source") or "pin"),
            created=boundary.created,
        )
    return list(found.values())


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
    store: Store,
    run_id: str,
    prefix: str,
    ranges: Ranges,
) -> tuple[list[Message], list[MessageRecord]]:
    """The messages a boundary's ``prefix`` and ``ranges`` stand for, and the records of
    the original messages among them."""
    messages = list(messages_from_json(prefix))
    records: list[MessageRecord] = []
    for first, last in ranges:
        assert first is not None
        records += await store.load_messages(run_id, from_seq=first, to_seq=last)
    messages.extend(await messages_for(store, records))
    return messages, records


def usage_anchor(
    calls: Sequence[CallRecord],
    records: Sequence[MessageRecord],
    messages: Sequence[Message],
    boundary_created: float | None,
) -> tuple[Usage, list[Message]] | None:
    """What a resumed run anchors its token accounting on, as the live run did: the last
    committed response's usage and the messages appended since, so it makes the same
    compaction decisions as an uninterrupted run (``None``: no anchor). ``messages`` are
    the last ``len(records)`` messages of the context: the ones ``records`` store."""
    last = next(
        (c for c in reversed(calls) if c.status == "ok" and c.message_seq is not None), None
    )
    if last is None or last.usage is None or last.message_seq is None:
        return None
    if boundary_created is not None and (last.finished or 0.0) < boundary_created:
        return None  # compacted since: the live run had dropped its anchor too
    if not any(r.seq == last.message_seq for r in records):
        return None
    stored = messages[len(messages) - len(records) :]
    return call_usage(last), [
        m for r, m in zip(records, stored, strict=True) if r.seq > last.message_seq
    ]
