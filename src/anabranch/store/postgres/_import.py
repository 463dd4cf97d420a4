"""``import_sqlite``: copy every session of a SQLite store into a PostgreSQL store.

Rows keep their ids (calls, boundaries and messages refer to each other by id) and their
order; one transaction, so a failed import leaves the target as it was. Leases are not
copied (no process drives a session of a file being migrated). Refuses a target that
already has any of the sessions.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg

from anabranch.errors import DatabaseError
from anabranch.store._dsn import redact_dsn
from anabranch.store.postgres._connection import connect
from anabranch.store.postgres._migrate import migrate
from anabranch.store.postgres._schema import APPEND_ONLY, BUDGET_TABLES
from anabranch.store.sqlite._blobs import hydrate_rows

__all__ = ["import_sqlite"]

TABLES = (
    *(t for t in APPEND_ONLY if t not in ("messages", "tool_events", "spills")),
    "tool_events",
    "spills",
    "messages",
    *BUDGET_TABLES,
)
"""Every history table (and the budget tables), in an order that satisfies the foreign keys;
tool events before messages and spills, whose search text may read them (a reference to a
result or a spilled output)."""
BOOLEAN_COLUMNS = {("tool_events", "is_error")}
HEX_COLUMNS = {("calls", "fingerprint"), ("run_spans", "trace_id"), ("run_spans", "span_id")}
SERIALS = [(table, "id") for table in TABLES if table not in ("sessions", "runs", "spills")] + [
    ("runs", "ord")
]
"""Sequences to move past the copied rows."""
BATCH = 1000


def import_sqlite(source: Path, dsn: str) -> dict[str, int]:
    """Copy ``source`` (an anabranch SQLite file, read only) into ``dsn``; rows per table.

    Raises:
        DatabaseError: not an anabranch file, an older or newer schema, or a session id
            that is already in the target.
    """
    from anabranch.store.sqlite._schema import SCHEMA_VERSION as SQLITE_VERSION

    source = source.expanduser()
    if not source.is_file():
        raise DatabaseError(f"no anabranch database at {source}")
    src = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)
    try:
        meta = _sqlite_meta(src, source)
        if meta.get("app") != "anabranch":
            raise DatabaseError(f"{source} is not an anabranch database")
        if int(meta.get("schema_version", "0")) != SQLITE_VERSION:
            raise DatabaseError(
                f"{source} has schema version {meta.get('schema_version')}; open it once with "
                f"this anabranch (schema {SQLITE_VERSION}) to migrate it, then import"
            )
        conn = connect(dsn)
        try:
            counts = _import(src, conn, dsn)
        except psycopg.Error as exc:
            message = " ".join(str(exc).split())
            raise DatabaseError(f"importing into {redact_dsn(dsn)} failed: {message}") from None
        finally:
            conn.close()
    finally:
        src.close()
    return counts


def _import(src: sqlite3.Connection, conn: Any, dsn: str) -> dict[str, int]:
    migrate(conn, True, redact_dsn(dsn))
    with conn.transaction():
        ids = [row[0] for row in src.execute("SELECT id FROM sessions")]
        taken = conn.execute(
            "SELECT id FROM sessions WHERE id = ANY(%s) LIMIT 3", (ids,)
        ).fetchall()
        if taken:
            names = ", ".join(r["id"] for r in taken)
            raise DatabaseError(f"{redact_dsn(dsn)} already has sessions {names}")
        counts = {table: _copy(src, conn, table) for table in TABLES}
        for table, column in SERIALS:
            conn.execute(
                "SELECT setval(pg_get_serial_sequence(%s, %s), "
                f"GREATEST((SELECT MAX({column}) FROM {table}), 1))",
                (f"anabranch.{table}", column),
            )
    return counts


def _sqlite_meta(src: sqlite3.Connection, source: Path) -> dict[str, str]:
    try:
        return dict(src.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.DatabaseError as exc:
        raise DatabaseError(f"{source} is not an anabranch database: {exc}") from exc


def _value(table: str, column: str, value: Any) -> Any:
    """A SQLite value as the PostgreSQL column takes it (booleans; the hex ids the file
    keeps as the bytes they spell are hex text)."""
    if (table, column) in BOOLEAN_COLUMNS:
        return bool(value)
    if isinstance(value, bytes) and (table, column) in HEX_COLUMNS:
        return value.hex()
    return value


def _order(src: sqlite3.Connection, table: str) -> str:
    """Insertion order (the rowid), or the key of a ``WITHOUT ROWID`` table."""
    row = src.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    if row and "WITHOUT ROWID" in str(row[0]).upper():
        return "1"  # by its key: nothing refers to these rows by position
    return "rowid"


def _copy(src: sqlite3.Connection, conn: Any, table: str) -> int:
    """Copy one table; image and document payloads the file keeps as blobs go inline."""
    source_columns = [row[1] for row in src.execute(f"PRAGMA table_info({table})")]
    target_columns = {
        row["column_name"]
        for row in conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = 'anabranch' AND table_name = %s",
            (table,),
        )
    }
    columns = [c for c in source_columns if c in target_columns]
    quoted = ", ".join(f'"{c}"' for c in columns)
    insert = f"INSERT INTO {table} ({quoted}) VALUES ({', '.join('%s' for _ in columns)})"
    cursor = src.execute(f"SELECT {quoted} FROM {table} ORDER BY {_order(src, table)}")
    copied = 0
    while batch := cursor.fetchmany(BATCH):
        rows = hydrate_rows(src, [dict(zip(columns, row, strict=True)) for row in batch])
        values = [[_value(table, c, row[c]) for c in columns] for row in rows]
        with conn.cursor() as out:
            out.executemany(insert, values)
        copied += len(values)
    return copied
