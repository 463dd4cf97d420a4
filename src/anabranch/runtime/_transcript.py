"""A run's transcript: every message its model was shown, in order, with each compaction
boundary where it happened (and what the model saw from there on), tool payloads
abbreviated."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from anabranch.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock, messages_from_json
from anabranch.runtime._history import boundary_extra, messages_for
from anabranch.store import BoundaryRecord, Store

__all__ = ["TranscriptEntry", "abbreviate", "render_transcript", "run_transcript"]

PAYLOAD_CHARS = 240
"""How much of a tool call's input or a tool result a transcript shows."""


class TranscriptEntry(BaseModel):
    """A message of the run, or a boundary (the context was rebuilt here)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["message", "boundary"]
    seq: int | None = None
    role: str | None = None
    turn: int | None = None
    """For an assistant message: the model call (turn) that produced it."""
    blocks: list[dict[str, Any]] = []
    """Each block as ``{"type": ..., ...}`` with tool payloads cut to a preview."""
    boundary: dict[str, Any] | None = None
    """For a boundary: id, kind, strategy, trigger, tokens and messages before/after."""
    shown_after: list[list[dict[str, Any]]] = []
    """For a boundary: the messages that now open the context (e.g. the summary)."""


def abbreviate(text: str, limit: int = PAYLOAD_CHARS) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} chars)"


def _blocks(message: Message) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            out.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolUseBlock):
            arguments = abbreviate(json.dumps(block.input, sort_keys=True))
            out.append({"type": "tool_use", "id": block.id, "name": block.name, "input": arguments})
        elif isinstance(block, ToolResultBlock):
            out.append(
                {
                    "type": "tool_result",
                    "tool_use_id": block.tool_use_id,
                    "is_error": block.is_error,
                    "content": abbreviate(block.content),
                }
            )
        else:
            out.append({"type": getattr(block, "type", "other")})
    return out


def _boundary_entry(boundary: BoundaryRecord) -> TranscriptEntry:
    shown = [_blocks(m) for m in messages_from_json(boundary.prefix)] if boundary.prefix else []
    return TranscriptEntry(
        kind="boundary",
        boundary={
            "id": boundary.id,
            "kind": boundary.kind,
            "strategy": boundary.strategy,
            "trigger": boundary.trigger,
            "status": boundary.status,
            "tokens_before": boundary.tokens_before,
            "tokens_after": boundary.tokens_after,
            "messages_before": boundary.messages_before,
            "messages_after": boundary.messages_after,
        },
        shown_after=shown,
    )


async def run_transcript(store: Store, run_id: str) -> list[TranscriptEntry]:
    """Messages in order, boundaries (ok ones) placed where they were committed."""
    records = [r for r in await store.load_messages(run_id) if r.kind == "message"]
    messages = dict(zip((r.seq for r in records), await messages_for(store, records), strict=True))
    boundaries = [
        b
        for b in await store.list_boundaries(run_id=run_id)
        if b.status == "ok" and b.kind in ("compaction", "clear", "rewind")
    ]
    calls = {c.message_seq: c.turn for c in await store.list_calls(run_id) if c.status == "ok"}

    def position(boundary: BoundaryRecord) -> int:
        next_seq = boundary_extra(boundary).get("next_seq")
        if isinstance(next_seq, int):
            return next_seq
        before = [r.seq for r in records if r.created <= boundary.created]
        return (max(before) + 1) if before else 0

    placed = sorted(((position(b), b) for b in boundaries), key=lambda p: (p[0], p[1].id or 0))
    entries: list[TranscriptEntry] = []
    index = 0
    for record in records:
        while index < len(placed) and placed[index][0] <= record.seq:
            entries.append(_boundary_entry(placed[index][1]))
            index += 1
        entries.append(
            TranscriptEntry(
                kind="message",
                seq=record.seq,
                role=record.role,
                turn=calls.get(record.seq),
                blocks=_blocks(messages[record.seq]),
            )
        )
    entries.extend(_boundary_entry(b) for _, b in placed[index:])
    return entries


def _block_lines(block: dict[str, Any]) -> list[str]:
    kind = block.get("type")
    if kind == "text":
        return str(block["text"]).splitlines() or [""]
    if kind == "tool_use":
        return [f"→ {block['name']}({block['input']})  [{block['id']}]"]
    if kind == "tool_result":
        mark = "✗" if block.get("is_error") else "←"
        return [f"{mark} {block['content']}  [{block['tool_use_id']}]"]
    return [f"[{kind} block]"]


def render_transcript(entries: list[TranscriptEntry]) -> str:
    """The transcript as text, one block per message, boundaries as rules."""
    lines: list[str] = []
    for entry in entries:
        if entry.kind == "boundary":
            b = entry.boundary or {}
            lines.append(
                f"════ {b.get('kind')} #{b.get('id')} ({b.get('strategy')}, {b.get('trigger')}): "
                f"{b.get('tokens_before')} → {b.get('tokens_after')} tokens, "
                f"{b.get('messages_before')} → {b.get('messages_after')} messages; "
                "from here the model was shown: ════"
            )
            for blocks in entry.shown_after:
                for block in blocks:
                    lines.extend(f"  ┆ {line}" for line in _block_lines(block))
            lines.append("  ┆ … then the kept recent messages, and what follows")
            continue
        header = f"--- #{entry.seq} {entry.role}"
        if entry.turn is not None:
            header += f" (turn {entry.turn})"
        lines.append(header + " ---")
        for block in entry.blocks:
            lines.extend(f"  {line}" for line in _block_lines(block))
    return "\n".join(lines)
