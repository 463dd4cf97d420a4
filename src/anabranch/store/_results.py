"""Rows read back as records, the same for every backend (the reads return the same
columns): the result assembly both backends share."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from anabranch.errors import StoreError
from anabranch.store._records import HistoryHit, SpillRecord

__all__ = ["history_hits", "spill_record"]


def spill_record(handle: str, row: dict[str, Any]) -> SpillRecord:
    """The spill behind ``handle`` from its row (``handle, run_id, call_id, content,
    created, event_id``, its content read from its tool event where it refers to one).

    Raises:
        StoreError: the spill refers to a tool event that is not stored.
    """
    event_id = row.pop("event_id")
    if row["content"] is None:
        raise StoreError(
            f"spill {handle!r} refers to tool event {event_id} of call {row['call_id']!r} "
            f"(run {row['run_id']}), which is not in the store"
        )
    return SpillRecord(**row)


def history_hits(rows: Iterable[dict[str, Any]]) -> list[HistoryHit]:
    """Full-text matches from their rows (``source, ref, snippet``), in the rows' order."""
    return [HistoryHit(row["source"], str(row["ref"]), row["snippet"]) for row in rows]
