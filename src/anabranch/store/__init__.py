"""Persistence: the ``Store`` protocol, its records, and the SQLite and PostgreSQL backends.

Knows nothing of models or contexts. ``open_store`` picks the backend from the database
string; ``PostgresStore`` needs the ``postgres`` extra (it is imported on first use)."""

from typing import TYPE_CHECKING, Any

from anabranch.store._dsn import is_postgres_url as is_postgres_url
from anabranch.store._dsn import redact_dsn as redact_dsn
from anabranch.store._open import describe_db as describe_db
from anabranch.store._open import open_store as open_store
from anabranch.store._protocol import Store as Store
from anabranch.store._records import BoundaryRecord as BoundaryRecord
from anabranch.store._records import CallRecord as CallRecord
from anabranch.store._records import CallUsageSum as CallUsageSum
from anabranch.store._records import ContextLimitRecord as ContextLimitRecord
from anabranch.store._records import HistoryHit as HistoryHit
from anabranch.store._records import MessageRecord as MessageRecord
from anabranch.store._records import RunRecord as RunRecord
from anabranch.store._records import RunStatus as RunStatus
from anabranch.store._records import SessionBudgetRecord as SessionBudgetRecord
from anabranch.store._records import SessionRecord as SessionRecord
from anabranch.store._records import SnapshotRecord as SnapshotRecord
from anabranch.store._records import SpendRecord as SpendRecord
from anabranch.store._records import SpendTotal as SpendTotal
from anabranch.store._records import SpillRecord as SpillRecord
from anabranch.store._records import ToolEvent as ToolEvent
from anabranch.store._records import ToolEventRecord as ToolEventRecord
from anabranch.store.sqlite import SQLiteStore as SQLiteStore

__all__ = [
    "BoundaryRecord",
    "CallRecord",
    "CallUsageSum",
    "ContextLimitRecord",
    "HistoryHit",
    "MessageRecord",
    "PostgresStore",
    "RunRecord",
    "RunStatus",
    "SQLiteStore",
    "SessionBudgetRecord",
    "SessionRecord",
    "SnapshotRecord",
    "SpendRecord",
    "SpendTotal",
    "SpillRecord",
    "Store",
    "ToolEvent",
    "ToolEventRecord",
    "describe_db",
    "is_postgres_url",
    "open_store",
    "redact_dsn",
]

if TYPE_CHECKING:
    from anabranch.store.postgres import PostgresStore as PostgresStore


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":  # psycopg is an optional dependency
        from anabranch.store.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
