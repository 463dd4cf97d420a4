"""Statements the PostgreSQL store's writes are built from (run inside a batch's ``Tx``)."""

from __future__ import annotations

import functools
from typing import Any

import psycopg

from anabranch.errors import StoreError
from anabranch.store.postgres._connection import Later, Tx

__all__ = ["SAVE_SPILL", "insert", "insert_id", "rowcount"]

SAVE_SPILL = """
    INSERT INTO spills (handle, run_id, call_id, content, created, event_id)
    SELECT %(handle)s, %(run_id)s, %(call_id)s,
           CASE WHEN e.id IS NULL THEN %(content)s::text END, %(created)s, e.id
    FROM (SELECT 1) one LEFT JOIN LATERAL (
        SELECT t.id FROM tool_events t
        WHERE t.run_id = %(run_id)s AND t.call_id = %(call_id)s AND t.event = 'finished'
          AND t.content = %(content)s::text
        ORDER BY t.id DESC LIMIT 1) e ON true
    ON CONFLICT (handle) DO NOTHING
"""
"""A spill row: its text, or (when that is its call's finished event's) the event's id."""


@functools.lru_cache(maxsize=64)
def insert_sql(table: str, columns: tuple[str, ...]) -> str:
    names = ", ".join(columns)
    marks = ", ".join(f"%({name})s" for name in columns)
    return f"INSERT INTO {table} ({names}) VALUES ({marks})"


def insert(tx: Tx, table: str, values: dict[str, Any]) -> None:
    tx.send(insert_sql(table, tuple(values)), values)


def insert_id(tx: Tx, table: str, values: dict[str, Any]) -> Later[int]:
    """Insert a row; its ``id``, read once the batch's statements have run."""
    cursor = tx.execute(f"{insert_sql(table, tuple(values))} RETURNING id", values)

    def new_id() -> int:
        row = cursor.fetchone()
        if row is None:  # pragma: no cover - INSERT … RETURNING always returns its row
            raise StoreError(f"no id returned by the insert into {table}")
        return int(row["id"])

    return Later(new_id)


def rowcount(cursor: psycopg.Cursor[Any]) -> Later[bool]:
    """Whether the statement touched a row, read once the batch's statements have run."""
    return Later(lambda: cursor.rowcount > 0)
