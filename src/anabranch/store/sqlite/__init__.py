"""The SQLite backend of ``anabranch.store.Store``: one file, WAL, group-committed writes.

``_open`` validates, configures and migrates the file (``_schema`` holds the versions);
``_group_commit`` is the connection every statement goes through (its docstring holds the
write invariants); ``_store`` and ``_history`` are the queries; ``_rows`` their helpers.
"""

from anabranch.store.sqlite._open import Synchronous as Synchronous
from anabranch.store.sqlite._store import SQLiteStore as SQLiteStore

__all__ = ["SQLiteStore", "Synchronous"]
