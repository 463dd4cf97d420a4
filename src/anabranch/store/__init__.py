"""Persistence: the ``Store`` protocol, its records, and the SQLite backend.

Knows nothing of models or contexts."""

from anabranch.store._protocol import Store as Store
from anabranch.store._records import BoundaryRecord as BoundaryRecord
from anabranch.store._records import CallRecord as CallRecord
from anabranch.store._records import ContextLimitRecord as ContextLimitRecord
from anabranch.store._records import HistoryHit as HistoryHit
from anabranch.store._records import MessageRecord as MessageRecord
from anabranch.store._records import RunRecord as RunRecord
from anabranch.store._records import RunStatus as RunStatus
from anabranch.store._records import SessionRecord as SessionRecord
from anabranch.store._records import SnapshotRecord as SnapshotRecord
from anabranch.store._records import SpillRecord as SpillRecord
from anabranch.store._records import ToolEventRecord as ToolEventRecord
from anabranch.store.sqlite import SQLiteStore as SQLiteStore

__all__ = [
    "BoundaryRecord",
    "CallRecord",
    "ContextLimitRecord",
    "HistoryHit",
    "MessageRecord",
    "RunRecord",
    "RunStatus",
    "SQLiteStore",
    "SessionRecord",
    "SnapshotRecord",
    "SpillRecord",
    "Store",
    "ToolEventRecord",
]
