"""The SQLite store's inserts run through one kept cursor.

CPython's sqlite3 keeps a weak reference to every cursor a connection makes and prunes
them only every 200 cursors: a cursor per insert kept ~6 weak references per model call
alive across the model's wait (6.4 inserts per call in the 1,000-run bench), where the GC
promotes them. What a user relies on: the store's connection leaves nothing per insert,
and each insert still returns its own rowid.
"""

from __future__ import annotations

import gc
import sqlite3
import weakref
from pathlib import Path

from anabranch.store.sqlite._open import open_connection
from anabranch.store.sqlite._rows import StoreConnection, insert


def _weak_references() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is weakref.ReferenceType)


def _table(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT NOT NULL)")


def test_the_store_connection_leaves_no_weak_reference_per_insert(tmp_path: Path) -> None:
    conn = open_connection(tmp_path / "lean.db", create=True, synchronous="NORMAL")
    try:
        assert isinstance(conn, StoreConnection)
        _table(conn)
        insert(conn, "notes", {"text": "warm"})  # the kept cursor exists from here on
        # sqlite3 prunes its list every 200 cursors: sample across more than one period
        counts: list[int] = []
        rowids: list[int] = []
        for _ in range(10):
            counts.append(_weak_references())
            rowids += [insert(conn, "notes", {"text": f"note {i}"}) for i in range(25)]
        assert max(counts) - min(counts) < 10, counts
        assert rowids == list(range(2, 252))  # each insert's own rowid, in order
        assert conn.execute("SELECT count(*) FROM notes").fetchone() == (251,)
    finally:
        conn.close()


def test_a_plain_connection_still_inserts(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "plain.db", isolation_level=None)
    try:
        _table(conn)
        assert [insert(conn, "notes", {"text": t}) for t in ("a", "b")] == [1, 2]
    finally:
        conn.close()


def test_rows_of_one_table_with_other_columns_each_get_their_own_statement(
    tmp_path: Path,
) -> None:
    """Statements are kept by table and columns: a row with fewer (or other) columns is
    inserted with its own, never with another shape's."""
    conn = open_connection(tmp_path / "db", create=True, synchronous="NORMAL")
    conn.execute("CREATE TABLE pairs (id INTEGER PRIMARY KEY, a TEXT, b TEXT)")
    insert(conn, "pairs", {"a": "x", "b": "y"})
    insert(conn, "pairs", {"a": "only a"})
    insert(conn, "pairs", {"b": "only b"})
    insert(conn, "pairs", {"b": "b first", "a": "a second"})
    rows = conn.execute("SELECT a, b FROM pairs ORDER BY id").fetchall()
    conn.close()
    assert rows == [("x", "y"), ("only a", None), (None, "only b"), ("a second", "b first")]
