"""Read a test database directly, whichever backend it is (a SQLite file or a DSN)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

Db = Path | str


def is_postgres(db: Db) -> bool:
    return isinstance(db, str) and db.startswith("postgresql://")


def rows(db: Db, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run ``sql`` (``?`` placeholders) on ``db`` and return its rows as tuples."""
    if not is_postgres(db):
        with sqlite3.connect(os.fspath(db)) as conn:
            return conn.execute(sql, params).fetchall()
    import psycopg

    with psycopg.connect(str(db), autocommit=True) as conn:
        conn.execute("SET search_path TO anabranch")
        cursor = conn.execute(sql.replace("?", "%s"), params)
        return cursor.fetchall() if cursor.description else []


def table_names(db: Db) -> list[str]:
    if not is_postgres(db):
        return [r[0] for r in rows(db, "SELECT name FROM sqlite_master WHERE type='table'")]
    return [
        r[0] for r in rows(db, "SELECT tablename FROM pg_tables WHERE schemaname = 'anabranch'")
    ]


def table_counts(db: Db) -> dict[str, int]:
    return {name: rows(db, f"SELECT COUNT(*) FROM {name}")[0][0] for name in table_names(db)}


def whole_copies(db: Db, text: str) -> dict[str, int]:
    """Where ``text`` is stored whole: table -> occurrences (full-text indexes hold terms,
    not text; SQLite's FTS tables read their text through views, so they are skipped)."""
    virtual: set[str] = set()
    if not is_postgres(db):
        with sqlite3.connect(os.fspath(db)) as conn:
            virtual = {
                name
                for name, sql in conn.execute("SELECT name, sql FROM sqlite_master")
                if sql and sql.upper().startswith("CREATE VIRTUAL TABLE")
            }
    found: dict[str, int] = {}
    for table in table_names(db):
        if table in virtual:
            continue
        count = sum(
            value.count(text)
            for row in rows(db, f"SELECT * FROM {table}")
            for value in row
            if isinstance(value, str)
        )
        if count:
            found[table] = count
    return found
