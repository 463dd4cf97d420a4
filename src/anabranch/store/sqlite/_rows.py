"""Row helpers of the SQLite store: records to column values, and the joined read queries."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from anabranch.store._records import CallRecord, ToolEventRecord
from anabranch.store._rows import call_row, message_row, snapshot_row, tool_event_row
from anabranch.store.sqlite._blobs import BLOB_COLUMNS, dehydrate, hydrate_rows

__all__ = [
    "CALL_SQL",
    "INSERT_CALL",
    "INSERT_MESSAGE",
    "INSERT_OUTCOME",
    "INSERT_RUN_END",
    "INSERT_TOOL_EVENT",
    "OK_USAGE",
    "OUTCOME_COLUMNS",
    "RUN_SQL",
    "SESSION_SQL",
    "HotInsert",
    "StoreConnection",
    "call_record",
    "call_values",
    "fetch_rows",
    "hex_bytes",
    "hex_text",
    "insert",
    "message_row",
    "snapshot_row",
    "tool_event_record",
    "tool_event_row",
    "usage_sums",
]

SESSION_SQL = """
    SELECT s.*, e.status AS status, e.output AS output, e.error AS error,
           CASE WHEN e.status = 'running' THEN NULL ELSE e.created END AS finished
    FROM sessions s
    JOIN session_events e ON e.id = (
        SELECT MAX(id) FROM session_events WHERE session_id = s.id)
"""
"""A session with its status: the latest of its ``session_events``."""

RUN_SQL = """
    SELECT r.*, COALESCE(e.status, 'running') AS status, e.output AS output,
           e.error AS error, e.finished AS finished
    FROM runs r LEFT JOIN run_ends e ON e.run_id = r.id
"""
"""A run with its end, if it has one."""

CALL_SQL = """
    SELECT c.*, o.status AS status, o.error_type AS error_type, o.error AS error,
           o.response_id AS response_id, o.model AS model, o.stop_reason AS stop_reason,
           o.usage AS usage, o.message_seq AS message_seq, o.created AS finished
    FROM calls c LEFT JOIN call_outcomes o ON o.call_id = c.id
"""
"""A call attempt with its outcome, if it has one."""


def hex_bytes(text: str) -> bytes | str:
    """A lowercase hex id (a digest, a trace or span id) as the bytes it spells: half the
    room. Any other text is kept as it is. ``hex_text`` reads it back."""
    try:
        value = bytes.fromhex(text)
    except ValueError:
        return text
    return value if value.hex() == text else text


def hex_text(value: bytes | str) -> str:
    return value.hex() if isinstance(value, bytes) else str(value)


def call_values(call: CallRecord) -> dict[str, Any]:
    """A call's row (``call_row``'s, in its order); its fingerprint (a SHA-256 in hex)
    kept as the 32 bytes it spells."""
    return {**call_row(call), "fingerprint": hex_bytes(call.fingerprint)}


def call_record(row: dict[str, Any]) -> CallRecord:
    """A call read back (its fingerprint in hex again)."""
    return CallRecord(**{**row, "fingerprint": hex_text(row["fingerprint"])})


def tool_event_record(row: dict[str, Any]) -> ToolEventRecord:
    """A tool event read back (its ``is_error`` a bool again: SQLite keeps an integer)."""
    return ToolEventRecord(**{**row, "is_error": bool(row["is_error"])})


class StoreConnection(sqlite3.Connection):
    """The store's read-write connection: its inserts run through one kept cursor.

    CPython's sqlite3 keeps a weak reference to every cursor a connection makes and
    prunes that list only every 200 cursors, so a cursor per insert (``conn.execute``)
    left each one's weak reference alive for the next ~200 statements: across a model
    call's wait, long enough for the cyclic GC to promote it (about 20 per model call in
    the 1,000-run bench), and every full collection then walks them. An insert reads
    nothing back but its rowid, at once, and the store's writes run one at a time (its
    group commit), so one cursor serves them all.
    """

    _insert_cursor: sqlite3.Cursor | None = None

    def insert_cursor(self) -> sqlite3.Cursor:
        if self._insert_cursor is None:
            self._insert_cursor = self.cursor()
        return self._insert_cursor


_INSERTS: dict[tuple[str, ...], str] = {}
"""Each ``INSERT`` statement by its table and columns (the row dicts' keys are the code's,
a few dozen shapes): built once, not joined again for every row."""


def _insert_sql(key: tuple[str, ...]) -> str:
    table, *columns = key
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    if len(_INSERTS) < 512:
        _INSERTS[key] = sql
    return sql


class HotInsert:
    """The ``INSERT`` of one hot table for rows of one fixed shape: the keys, in order, of
    the row function that builds them (``tests/test_hot_insert.py`` holds them equal).

    ``insert`` works out each row's statement from its table and keys and passes every
    row of a table with payload columns through ``dehydrate``: ~0.75 µs a row on the
    writer thread, ~6 rows a model call. A hot write knows its rows' shape, so its
    statement is built once, and only a row whose payload column may hold an image or a
    document (the text ``dehydrate`` looks for first) takes the general way."""

    __slots__ = ("payload", "sql", "table")

    def __init__(self, table: str, columns: tuple[str, ...], payload: str | None = None) -> None:
        self.table, self.payload = table, payload
        self.sql = _insert_sql((table, *columns))

    def __call__(self, conn: sqlite3.Connection, values: dict[str, Any]) -> int:
        payload = self.payload
        if payload is not None:
            text = values[payload]
            if isinstance(text, str) and '"data":' in text:
                return insert(conn, self.table, values)
        runner = conn.insert_cursor() if isinstance(conn, StoreConnection) else conn
        return int(runner.execute(self.sql, tuple(values.values())).lastrowid or 0)


def insert(conn: sqlite3.Connection, table: str, values: dict[str, Any]) -> int:
    """Insert one row; its rowid. Image and document payloads go to ``blobs`` (once)."""
    if table in BLOB_COLUMNS:
        values = dehydrate(conn, table, values)
    key = (table, *values)
    sql = _INSERTS.get(key) or _insert_sql(key)
    runner = conn.insert_cursor() if isinstance(conn, StoreConnection) else conn
    cursor = runner.execute(sql, tuple(values.values()))
    return int(cursor.lastrowid or 0)


def fetch_rows(
    conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()
) -> list[dict[str, Any]]:
    """The rows of a query as column-name dicts (blob references resolved)."""
    cursor = conn.execute(sql, tuple(params))
    names = [d[0] for d in cursor.description]
    return hydrate_rows(conn, [dict(zip(names, row, strict=True)) for row in cursor.fetchall()])


OUTCOME_COLUMNS = (
    "call_id",
    "status",
    "error_type",
    "error",
    "response_id",
    "model",
    "stop_reason",
    "usage",
    "message_seq",
    "created",
)
"""``finish_call``'s outcome row, in its order."""
INSERT_MESSAGE = HotInsert(
    "messages", ("run_id", "seq", "role", "content", "kind", "created"), payload="content"
)
INSERT_TOOL_EVENT = HotInsert(
    "tool_events",
    ("run_id", "call_id", "name", "event", "content", "is_error", "created", "attachments"),
    payload="attachments",
)
INSERT_CALL = HotInsert(
    "calls",
    (
        "run_id",
        "turn",
        "attempt",
        "fingerprint",
        "message_count",
        "created",
        "snapshot_version",
        "compactions",
        "settings",
    ),
)
INSERT_OUTCOME = HotInsert("call_outcomes", OUTCOME_COLUMNS)
INSERT_RUN_END = HotInsert("run_ends", ("run_id", "status", "output", "error", "finished"))


OK_USAGE = (  # the successful calls with a usage, for usage_sums
    "FROM calls c JOIN call_outcomes o ON o.call_id = c.id "
    "WHERE o.status = 'ok' AND o.usage IS NOT NULL"
)


def usage_sums(keys: Sequence[str]) -> str:
    """``SUM`` columns of the usage JSON's ``keys`` (checked: they are spliced into SQL)."""
    for key in keys:
        if not key.isidentifier():
            raise ValueError(f"not a usage key: {key!r}")
    return ", ".join(f"COALESCE(SUM(json_extract(o.usage, '$.{key}')), 0)" for key in keys)
