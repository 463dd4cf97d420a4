"""Restore after compaction: what an agent pinned is re-attached to its compacted context.

A tool pins with ``ToolContext.pin(text)``, or every result of a ``@tool(pin=True)``; the
loop commits each pin (a spill under its recall handle, then a ``pin`` row) before the
call's result. Each compaction then re-attaches the latest pins, within caps, as one
``<pinned_items>`` block in the user turn that opens the compacted context (after the
summary, never in the system prompt, so the prompt snapshot stays prefix-stable). Pins over
the caps are named in the same block with their recall handle. The opening is part of the
boundary row, so a resumed run gets the very same context back.

Caps (the seed's): the ``MAX_ITEMS`` latest pins, ``MAX_ITEM_TOKENS`` each,
``MAX_TOTAL_TOKENS`` in all; in a small window, at most ``ROOM_SHARE`` of the room
messages have below the threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import quoteattr

from anabranch.context._budget import is_cleared
from anabranch.context._compaction import Rebuilt
from anabranch.context._tokens import estimate_messages
from anabranch.messages import Message, TextBlock, ToolResultBlock
from anabranch.runtime._compaction_step import CompactionStep
from anabranch.runtime._context_view import ContextStore
from anabranch.runtime._history import PinnedItem, pinned_items
from anabranch.store import BoundaryRecord

__all__ = [
    "MAX_ITEMS",
    "MAX_ITEM_TOKENS",
    "MAX_TOTAL_TOKENS",
    "PINNED_TAG",
    "Restored",
    "attach_pins",
    "restore_pins",
    "with_pins",
]

MAX_ITEMS = 5
MAX_ITEM_TOKENS = 5_000
MAX_TOTAL_TOKENS = 25_000
ROOM_SHARE = 0.25
"""Pins take at most this share of the room messages have below the threshold."""
MAX_NAMED = 20
"""Over-cap pins named one by one in the note (the rest are counted)."""
PINNED_TAG = "<pinned_items>"


@dataclass(frozen=True)
class Restored:
    """The pins one compaction re-attaches, and those it only names."""

    block: TextBlock | None
    attached: tuple[str, ...] = ()
    """Recall handles of the pins re-attached in full."""
    over_cap: tuple[str, ...] = ()
    """Recall handles of the pins named instead (over the caps)."""

    def as_dict(self) -> dict[str, list[str]]:
        return {"attached": list(self.attached), "over_cap": list(self.over_cap)}


def _tokens(text: str) -> int:
    return estimate_messages([Message.user(text)])


async def restore_pins(
    store: ContextStore,
    boundaries: Sequence[BoundaryRecord],
    tail: Sequence[Message],
    room: int,
) -> Restored:
    """The ``<pinned_items>`` block for a compacted context whose kept messages are
    ``tail`` (a pinned result still there word for word needs no copy)."""
    items = pinned_items(boundaries)
    if not items:
        return Restored(None)
    in_view = {  # results kept whole (not a stub, not a preview)
        b.tool_use_id
        for m in tail
        for b in m.content
        if isinstance(b, ToolResultBlock)
        and not is_cleared(b)
        and "recall id=out_" not in b.content
    }
    total_cap = min(MAX_TOTAL_TOKENS, int(room * ROOM_SHARE))
    item_cap = min(MAX_ITEM_TOKENS, total_cap)
    chosen: list[tuple[PinnedItem, str]] = []
    over: list[PinnedItem] = []
    used = 0
    for item in reversed(items):  # the latest pins first
        if item.source == "result" and item.call_id in in_view:
            continue
        spill = await store.get_spill_record(item.handle)
        if spill is None:  # pragma: no cover - committed before its row
            continue
        tokens = _tokens(spill.content)
        if len(chosen) >= MAX_ITEMS or tokens > item_cap or used + tokens > total_cap:
            over.append(item)
            continue
        chosen.append((item, spill.content))
        used += tokens
    if not chosen and not over:
        return Restored(None)
    chosen.reverse()
    over.reverse()
    lines = [PINNED_TAG, "Pinned earlier, re-attached after this compaction:"]
    for item, text in chosen:
        lines += [
            f"<pin label={quoteattr(item.label)} id={quoteattr(item.handle)}>",
            text,
            "</pin>",
        ]
    if over:
        named = "; ".join(f"{i.label} (recall id={i.handle})" for i in over[-MAX_NAMED:])
        more = len(over) - MAX_NAMED
        counted = f"; and {more} earlier pins (recall(query=...) finds them)" if more > 0 else ""
        lines.append(f"Over the pin caps, not re-attached (recall them by id): {named}{counted}")
    lines.append("</pinned_items>")
    return Restored(
        TextBlock(text="\n".join(lines)),
        attached=tuple(item.handle for item, _ in chosen),
        over_cap=tuple(item.handle for item in over),
    )


def attach_pins(rebuilt: Rebuilt, block: TextBlock, *, carry: Message | None) -> Rebuilt:
    """``rebuilt`` with ``block`` in its opening user turn, after the summary (before a
    plain user turn merged into it, ``carry``), replacing an earlier pinned block."""
    opening = rebuilt.messages[0]
    if opening.role != "user":  # pragma: no cover - every opening is a user turn
        return rebuilt
    content = [
        b
        for b in opening.content
        if not (isinstance(b, TextBlock) and b.text.startswith(PINNED_TAG))
    ]
    at = len(content) - (len(carry.content) if carry is not None else 0)
    content.insert(max(1, at), block)
    messages = (opening.model_copy(update={"content": tuple(content)}), *rebuilt.messages[1:])
    return Rebuilt(messages, (None, *rebuilt.sources[1:]), rebuilt.kept, rebuilt.spills)


async def with_pins(
    step: CompactionStep,
    rebuilt: Rebuilt,
    room: int,
    carry: Message | None,
    details: dict[str, Any],
) -> Rebuilt:
    """``rebuilt`` with the run's pins restored (``details["pins"]`` says which)."""
    restored = await restore_pins(step.store, await step.boundaries(), rebuilt.messages[1:], room)
    if restored.block is None:
        return rebuilt
    details["pins"] = restored.as_dict()
    return attach_pins(rebuilt, restored.block, carry=carry)
