"""Persistence: the write-ahead SQLite store. Knows nothing of models or contexts."""

from anabranch.store.records import BoundaryRecord as BoundaryRecord
from anabranch.store.records import CallRecord as CallRecord
from anabranch.store.records import HistoryHit as HistoryHit
from anabranch.store.records import MessageRecord as MessageRecord
from anabranch.store.records import RunRecord as RunRecord
from anabranch.store.records import RunStatus as RunStatus
from anabranch.store.records import SessionRecord as SessionRecord
from anabranch.store.records import SnapshotRecord as SnapshotRecord
from anabranch.store.records import SpillRecord as SpillRecord
from anabranch.store.records import ToolEventRecord as ToolEventRecord
from anabranch.store.sqlite import SQLiteStore as SQLiteStore

__all__ = [
    "BoundaryRecord",
    "CallRecord",
    "HistoryHit",
    "MessageRecord",
    "RunRecord",
    "RunStatus",
    "SQLiteStore",
    "SessionRecord",
    "SnapshotRecord",
    "SpillRecord",
    "ToolEventRecord",
]
