"""The history search indexes, filled once per write transaction (schema v13).

Up to v12 an ``AFTER INSERT`` trigger indexed each message and spill as it was written.
With FTS5 that is dear inside a group-committed batch: every savepoint and every
statement journal after the first indexed row flushes FTS5's pending terms to a new
segment, so each row paid for its own segment write and merge (about 20-50 µs a message
here). Since v13 the rows a transaction wrote are indexed just before it commits, in one
statement per index, so the search sees exactly what is committed, as before.

Which rows are new: ``meta`` keeps, per index, the highest rowid indexed (its mark). Every
row up to the mark is indexed and new rows get rowids above every existing one, so the
rows to index are those above it. When rows at the top were deleted (``delete_session``,
which indexes first), the mark comes down to the highest rowid left, so rowids used
again are indexed too. Rows written by a writer with no index step (a hand-written
fixture) are indexed by the next transaction.
"""

from __future__ import annotations

import sqlite3

__all__ = ["index_new_rows"]

_MARKS = (
    "SELECT (SELECT value FROM meta WHERE key = 'history_indexed'), "
    "(SELECT MAX(id) FROM messages), "
    "(SELECT value FROM meta WHERE key = 'history_spills_indexed'), "
    "(SELECT MAX(rowid) FROM spills)"
)
_INDEXES = (
    (
        "history_indexed",
        "INSERT INTO history_fts(rowid, body, run_id, source, ref) "
        "SELECT id, body, run_id, source, ref FROM history_messages WHERE id > ?",
    ),
    (
        "history_spills_indexed",
        "INSERT INTO history_spill_fts(rowid, body, run_id, source, ref) "
        "SELECT id, body, run_id, source, ref FROM history_spills WHERE id > ?",
    ),
)
_SET_MARK = "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)"


def index_new_rows(conn: sqlite3.Connection) -> None:
    """Index the messages and spills written since the indexes were last filled (inside
    the caller's transaction; before a deletion, so its ``'delete'`` commands find them,
    and after it, so the marks come down with the rows)."""
    row = conn.execute(_MARKS).fetchone()
    for (key, index_sql), mark, top in zip(_INDEXES, row[0::2], row[1::2], strict=True):
        indexed, highest = int(mark or 0), int(top or 0)
        if highest > indexed:
            conn.execute(index_sql, (indexed,))
        if highest != indexed:
            conn.execute(_SET_MARK, (key, str(highest)))
