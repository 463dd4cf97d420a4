"""Rewind: give a run back the context it had before a compaction, as a new branch.

A rewind is one more boundary (kind ``rewind``) whose prefix and ranges reproduce the
context as it was right before the chosen boundary; messages appended later join it. No
row is changed, so the branch that was left stays readable.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

from anabranch.context._layout import close_ranges
from anabranch.context._tokens import estimate_messages
from anabranch.errors import UserError
from anabranch.runtime._history import boundary_extra, boundary_ranges, context_for
from anabranch.store import BoundaryRecord, Store

__all__ = ["rewind_run"]

_LAYOUT_KINDS = ("compaction", "clear", "rewind")


def _previous(boundaries: list[BoundaryRecord], before: int) -> BoundaryRecord | None:
    earlier = [
        b
        for b in boundaries
        if b.id is not None and b.id < before and b.status == "ok" and b.kind in _LAYOUT_KINDS
    ]
    return earlier[-1] if earlier else None


async def rewind_run(
    store: Store, session_id: str, run_id: str, boundary_id: int
) -> BoundaryRecord:
    """Append a ``rewind`` boundary restoring ``run_id``'s context from before ``boundary_id``.

    Raises:
        UserError: unknown run or boundary, or a boundary that never changed the context.
    """
    run = await store.get_run(run_id)
    if run is None or run.session_id != session_id:
        raise UserError(f"no run {run_id!r} in session {session_id!r}")
    target = await store.get_boundary(boundary_id)
    if target is None or target.run_id != run_id:
        raise UserError(f"run {run_id} has no boundary {boundary_id}")
    cut = boundary_extra(target).get("next_seq")
    if target.status != "ok" or target.kind not in _LAYOUT_KINDS or cut is None:
        raise UserError(
            f"boundary {boundary_id} ({target.kind}, {target.status}) did not change the "
            "context: there is nothing to rewind"
        )
    boundaries = await store.list_boundaries(run_id=run_id)
    previous = _previous(boundaries, boundary_id)
    prefix = previous.prefix if previous else "[]"
    before_ranges = boundary_ranges(previous)
    ranges: list[list[int | None]] = [list(r) for r in close_ranges(before_ranges, int(cut))]
    next_seq = await store.next_seq(run_id)
    ranges.append([next_seq, None])
    restored, _ = await context_for(store, run_id, prefix, ranges)
    current = _previous(boundaries, 1 << 62)
    current_messages, _ = await context_for(
        store, run_id, current.prefix if current else "[]", boundary_ranges(current)
    )
    record = BoundaryRecord(
        run_id=run_id,
        kind="rewind",
        prefix=prefix,
        ranges=json.dumps(ranges),
        created=time.time(),
        trigger="rewind",
        strategy=previous.strategy if previous else None,
        tokens_before=estimate_messages(current_messages),
        tokens_after=estimate_messages(restored),
        messages_before=len(current_messages),
        messages_after=len(restored),
        status="ok",
        extra=json.dumps({"rewound": boundary_id, "next_seq": next_seq}),
    )
    new_id = await store.add_boundary(record)
    return replace(record, id=new_id)
