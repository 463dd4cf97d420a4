"""Preserved thinking: what a run may send back of its thinking blocks.

On the models that bind a thinking block to its prefix (the system prompt, the tools and
everything before the block), a block replayed after that prefix changed is refused. A run
changes what precedes its messages in exactly two ways: a compaction (the summary, clears
and stubs replace what came before the kept tail) and a new prompt snapshot (system or
tools changed). So a run keeps a *floor*: the number of leading context messages that
were produced under an earlier prefix. Requests carry no thinking for those messages; the
ones after the floor were produced under the request view as it still is, so theirs stays
valid, byte for byte. The floor is derived from what the store holds (the latest boundary
and snapshot), so a resumed run sends the same requests as the live one would have.

On the other models thinking is never bound to the prefix and nothing is removed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from anabranch._thinking_models import prefix_bound
from anabranch.context._content import drop_thinking
from anabranch.messages import Message, RawBlock
from anabranch.runtime._history import boundary_extra
from anabranch.store import BoundaryRecord, MessageRecord, SnapshotRecord

__all__ = ["floor_after_compaction", "floor_after_load", "is_server_opening", "request_messages"]


def is_server_opening(message: Message) -> bool:
    """Whether ``message`` is an API-written summary (a ``compaction`` block)."""
    first = message.content[0] if message.content else None
    return isinstance(first, RawBlock) and first.block.get("type") == "compaction"


def floor_after_compaction(old: Sequence[Message], new: Sequence[Message], floor: int) -> int:
    """The floor once ``new`` replaced ``old``. After our own summary (or clears, stubs)
    every kept message's prefix changed. After an API-written summary followed by the kept
    turns unchanged, only what was already below the floor stays there."""
    kept = len(new) - 1
    if new and is_server_opening(new[0]) and 0 <= kept <= len(old):
        cut = len(old) - kept
        if tuple(new[1:]) == tuple(old[cut:]):
            return 1 + max(0, floor - cut)
    return len(new)


def request_messages(model: str, context: Sequence[Message], floor: int) -> Sequence[Message]:
    """``context`` as sent to ``model``: on a prefix-bound model, without the thinking of
    the first ``floor`` messages (a turn that was only thinking keeps a short note)."""
    if floor <= 0 or not prefix_bound(model):
        return context
    head = context[:floor]
    if not any(m.thinking_blocks for m in head):
        return context
    return [*drop_thinking(head), *context[floor:]]


class _LoadedRun(Protocol):
    context: list[Message]
    snapshot_version: int


def floor_after_load(
    run: _LoadedRun,
    records: Sequence[MessageRecord],
    boundary: BoundaryRecord | None,
    snapshot: SnapshotRecord | None,
) -> int:
    """The floor of a run rebuilt from the store.

    ``records`` are the stored originals at the end of ``run.context`` (after a boundary's
    own messages); ``snapshot`` is the latest snapshot as loaded. If loading saved a newer
    one (the definition's tools changed), every loaded message predates the prefix the
    next request is sent with.
    """
    context = run.context
    if snapshot is not None and run.snapshot_version != snapshot.version:
        return len(context)
    floor = 0
    recorded = boundary_extra(boundary).get("thinking_floor") if boundary else None
    if boundary is not None and isinstance(recorded, int):
        floor = min(recorded, len(context))  # a server compaction kept valid thinking
    elif boundary is not None:
        after = boundary.messages_after
        rewritten = boundary.kind == "compaction" and after is not None
        floor = min(after, len(context)) if rewritten and after is not None else len(context)
    if snapshot is not None and snapshot.version > 1 and snapshot.reason != "compaction":
        # a snapshot taken mid-run: what was committed before it predates its prefix
        since = boundary.created if boundary is not None else 0.0
        if snapshot.created > since:
            offset = len(context) - len(records)
            older = sum(1 for r in records if r.created < snapshot.created)
            floor = max(floor, offset + older)
    return floor
