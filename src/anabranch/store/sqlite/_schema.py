"""Versioned schema and forward-only migrations.

Every table is insert-only except ``leases`` (who drives a session now) and ``meta``:
a session's or run's status is the latest row of ``session_events`` / ``run_ends``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported by the caller of ``migrate``: the module is slow to import
    import sqlite_utils

__all__ = ["APP_ID", "SCHEMA_VERSION", "migrate"]

APP_ID = "anabranch"


def _v1(db: sqlite_utils.Database) -> None:
    db.table("meta").create({"key": str, "value": str}, pk="key")
    db.table("sessions").create(
        {
            "id": str,
            "created": float,
            "kind": str,
            "entry": str,
            "task": str,
            "source": str,
            "definition": str,
        },
        pk="id",
    )
    db.table("session_events").create(
        {
            "id": int,
            "session_id": str,
            "status": str,
            "output": str,
            "error": str,
            "created": float,
        },
        pk="id",
    )
    db.table("session_events").create_index(["session_id"])
    db.table("leases").create(
        {"session_id": str, "owner": str, "host": str, "pid": int, "expires": float},
        pk="session_id",
    )
    db.table("runs").create(
        {
            "id": str,
            "session_id": str,
            "parent_run_id": str,
            "parent_call_id": str,
            "task_id": str,
            "agent_name": str,
            "model": str,
            "depth": int,
            "mode": str,
            "created": float,
        },
        pk="id",
    )
    db.table("run_ends").create(
        {"run_id": str, "status": str, "output": str, "error": str, "finished": float},
        pk="run_id",
    )
    db.table("runs").create_index(["session_id"])
    db.table("runs").create_index(["parent_run_id", "parent_call_id"])
    db.table("messages").create(
        {
            "id": int,
            "run_id": str,
            "seq": int,
            "role": str,
            "content": str,
            "kind": str,
            "created": float,
        },
        pk="id",
    )
    db.table("messages").create_index(["run_id", "seq"], unique=True)
    db.table("calls").create(
        {
            "id": int,
            "run_id": str,
            "turn": int,
            "attempt": int,
            "fingerprint": str,
            "message_count": int,
            "created": float,
        },
        pk="id",
    )
    db.table("calls").create_index(["run_id", "turn"])
    db.table("call_outcomes").create(
        {
            "id": int,
            "call_id": int,
            "status": str,
            "error_type": str,
            "error": str,
            "response_id": str,
            "model": str,
            "stop_reason": str,
            "usage": str,
            "message_seq": int,
            "created": float,
        },
        pk="id",
    )
    db.table("call_outcomes").create_index(["call_id"], unique=True)
    db.table("tool_events").create(
        {
            "id": int,
            "run_id": str,
            "call_id": str,
            "name": str,
            "event": str,
            "content": str,
            "is_error": int,
            "created": float,
        },
        pk="id",
    )
    db.table("tool_events").create_index(["run_id", "call_id"])
    db.table("snapshots").create(
        {
            "id": int,
            "run_id": str,
            "version": int,
            "reason": str,
            "system": str,
            "tools": str,
            "created": float,
        },
        pk="id",
    )
    db.table("snapshots").create_index(["run_id", "version"], unique=True)
    db.table("boundaries").create(
        {
            "id": int,
            "run_id": str,
            "kind": str,
            "prefix": str,
            "ranges": str,
            "strategy": str,
            "trigger": str,
            "tokens_before": int,
            "tokens_after": int,
            "messages_before": int,
            "messages_after": int,
            "summary": str,
            "model": str,
            "duration": float,
            "status": str,
            "error": str,
            "extra": str,
            "created": float,
        },
        pk="id",
    )
    db.table("boundaries").create_index(["run_id"])
    db.table("spills").create(
        {"handle": str, "run_id": str, "call_id": str, "content": str, "created": float},
        pk="handle",
    )
    db.table("spills").create_index(["run_id"])
    db.table("cache_breaks").create(
        {
            "id": int,
            "run_id": str,
            "call_id": int,
            "cause": str,
            "expected_read": int,
            "actual_read": int,
            "created": float,
        },
        pk="id",
    )
    db.table("cache_breaks").create_index(["run_id"])


def _v2_call_prefix(db: sqlite_utils.Database) -> None:
    """Which prompt snapshot and how many compactions each call was sent with."""
    db.table("calls").add_column("snapshot_version", int)
    db.table("calls").add_column("compactions", int)


_MESSAGE_TEXT = """(
    SELECT group_concat(
        COALESCE(
            json_extract(value, '$.text'),
            json_extract(value, '$.content'),
            json_extract(value, '$.name') || ' ' || json_extract(value, '$.input')
        ),
        char(10))
    FROM json_each({row}.content)
)"""


def _v3_history_search(db: sqlite_utils.Database) -> None:
    """Full-text search over each run's history (original messages and spilled outputs)."""
    db.execute(
        "CREATE VIRTUAL TABLE history_fts USING fts5("
        "body, run_id UNINDEXED, source UNINDEXED, ref UNINDEXED, tokenize='unicode61')"
    )
    db.execute(
        "CREATE TRIGGER history_fts_messages AFTER INSERT ON messages "
        "WHEN new.kind = 'message' BEGIN "
        "INSERT INTO history_fts(body, run_id, source, ref) VALUES ("
        f"{_MESSAGE_TEXT.format(row='new')}, new.run_id, 'message', new.seq); END"
    )
    db.execute(
        "CREATE TRIGGER history_fts_spills AFTER INSERT ON spills BEGIN "
        "INSERT INTO history_fts(body, run_id, source, ref) "
        "VALUES (new.content, new.run_id, 'spill', new.handle); END"
    )
    db.execute(
        "INSERT INTO history_fts(body, run_id, source, ref) "
        f"SELECT {_MESSAGE_TEXT.format(row='m')}, m.run_id, 'message', m.seq "
        "FROM messages m WHERE m.kind = 'message'"
    )
    db.execute(
        "INSERT INTO history_fts(body, run_id, source, ref) "
        "SELECT content, run_id, 'spill', handle FROM spills"
    )


def _v4_run_spans(db: sqlite_utils.Database) -> None:
    """Trace and span ids of each drive of a run, so a resumed run links to its earlier spans."""
    db.table("run_spans").create(
        {
            "id": int,
            "session_id": str,
            "run_id": str,
            "trace_id": str,
            "span_id": str,
            "created": float,
        },
        pk="id",
    )
    db.table("run_spans").create_index(["run_id"])


def _v5_history_search_external(db: sqlite_utils.Database) -> None:
    """The history index without a second copy of the text: external-content FTS5 tables
    over views of ``messages`` and ``spills`` (v3 stored every message's text twice)."""
    for statement in (
        "DROP TRIGGER IF EXISTS history_fts_messages",
        "DROP TRIGGER IF EXISTS history_fts_spills",
        "DROP TABLE IF EXISTS history_fts",
        "CREATE VIEW history_messages AS SELECT m.id AS id, "
        f"{_MESSAGE_TEXT.format(row='m')} AS body, m.run_id AS run_id, 'message' AS source, "
        "m.seq AS ref FROM messages m WHERE m.kind = 'message'",
        "CREATE VIEW history_spills AS SELECT s.rowid AS id, s.content AS body, "
        "s.run_id AS run_id, 'spill' AS source, s.handle AS ref FROM spills s",
        "CREATE VIRTUAL TABLE history_fts USING fts5(body, run_id UNINDEXED, "
        "source UNINDEXED, ref UNINDEXED, tokenize='unicode61', "
        "content='history_messages', content_rowid='id')",
        "CREATE VIRTUAL TABLE history_spill_fts USING fts5(body, run_id UNINDEXED, "
        "source UNINDEXED, ref UNINDEXED, tokenize='unicode61', "
        "content='history_spills', content_rowid='id')",
        "CREATE TRIGGER history_fts_messages AFTER INSERT ON messages "
        "WHEN new.kind = 'message' BEGIN "
        "INSERT INTO history_fts(rowid, body, run_id, source, ref) VALUES (new.id, "
        f"{_MESSAGE_TEXT.format(row='new')}, new.run_id, 'message', new.seq); END",
        "CREATE TRIGGER history_fts_spills AFTER INSERT ON spills BEGIN "
        "INSERT INTO history_spill_fts(rowid, body, run_id, source, ref) "
        "VALUES (new.rowid, new.content, new.run_id, 'spill', new.handle); END",
        # index what is there ('rebuild' cannot read a view with a correlated subquery)
        "INSERT INTO history_fts(rowid, body, run_id, source, ref) "
        "SELECT id, body, run_id, source, ref FROM history_messages",
        "INSERT INTO history_spill_fts(rowid, body, run_id, source, ref) "
        "SELECT id, body, run_id, source, ref FROM history_spills",
    ):
        db.execute(statement)


def _v6_content_blobs(db: sqlite_utils.Database) -> None:
    """Images and documents stored once, by content hash (messages refer to them); the
    attachments of a finished tool call; the cache-keying settings of each call."""
    db.table("blobs").create(
        {"digest": str, "data": str, "size": int, "created": float}, pk="digest"
    )
    db.table("tool_events").add_column("attachments", str)
    db.table("calls").add_column("settings", str)


def _v7_context_limits(db: sqlite_utils.Database) -> None:
    """Context limits channels taught per (model, channel), and the limit each run used."""
    db.table("context_limits").create(
        {
            "id": int,
            "model": str,
            "channel": str,
            "maximum": int,
            "ratio": float,
            "window": int,
            "source": str,
            "run_id": str,
            "created": float,
        },
        pk="id",
    )
    db.table("context_limits").create_index(["model", "channel"])
    db.table("context_limits").create_index(["run_id"])


def _v8_budgets(db: sqlite_utils.Database) -> None:
    """Tenants' spend (one row per call, summed over a period) and sessions' budgets."""
    db.table("tenant_spend").create(
        {
            "id": int,
            "tenant": str,
            "session_id": str,
            "run_id": str,
            "tokens": int,
            "cost_usd": float,
            "created": float,
        },
        pk="id",
    )
    db.table("tenant_spend").create_index(["tenant", "created"])
    db.table("session_budgets").create(
        {
            "id": int,
            "session_id": str,
            "tenant": str,
            "budget": str,
            "tenant_budget": str,
            "created": float,
        },
        pk="id",
    )
    db.table("session_budgets").create_index(["session_id"])


_RESULT_TEXT = """(
    SELECT t.content FROM tool_events t
    WHERE t.run_id = {row}.run_id AND t.call_id = json_extract(value, '$.tool_use_id')
      AND t.event = 'finished'
    ORDER BY t.id DESC LIMIT 1
)"""
"""The result a ``{"ref": "tool_event"}`` block stands for: its call's latest finished event
(the one the loop compared the block with when it wrote the reference)."""

_MESSAGE_TEXT_REFS = """(
    SELECT group_concat(
        CASE WHEN json_extract(value, '$.ref') = 'tool_event' THEN {result}
        ELSE COALESCE(
            json_extract(value, '$.text'),
            json_extract(value, '$.content'),
            json_extract(value, '$.name') || ' ' || json_extract(value, '$.input')
        ) END,
        char(10))
    FROM json_each({row}.content)
)"""


def _v9_tool_result_refs(db: sqlite_utils.Database) -> None:
    """A finished tool's output stored once: a message's tool_result block may refer to its
    call's finished event (``"ref": "tool_event"``); history search reads that event's
    text. The index itself is unchanged (every row indexed so far held its text)."""
    text = _MESSAGE_TEXT_REFS.format(result=_RESULT_TEXT.format(row="{row}"), row="{row}")
    for statement in (
        "DROP TRIGGER history_fts_messages",
        "DROP VIEW history_messages",
        "CREATE VIEW history_messages AS SELECT m.id AS id, "
        f"{text.format(row='m')} AS body, m.run_id AS run_id, 'message' AS source, "
        "m.seq AS ref FROM messages m WHERE m.kind = 'message'",
        "CREATE TRIGGER history_fts_messages AFTER INSERT ON messages "
        "WHEN new.kind = 'message' BEGIN "
        "INSERT INTO history_fts(rowid, body, run_id, source, ref) VALUES (new.id, "
        f"{text.format(row='new')}, new.run_id, 'message', new.seq); END",
    ):
        db.execute(statement)


def _v10_lean_history_index(db: sqlite_utils.Database) -> None:
    """The history index at less than half its size: ``detail=none`` (which documents hold
    a word, not where: search asks for words, never phrases) and ``automerge=2`` (fewer,
    larger segments). Rebuilt from what is stored."""
    for table, view in (
        ("history_fts", "history_messages"),
        ("history_spill_fts", "history_spills"),
    ):
        for statement in (
            f"DROP TABLE {table}",
            f"CREATE VIRTUAL TABLE {table} USING fts5(body, run_id UNINDEXED, "
            "source UNINDEXED, ref UNINDEXED, tokenize='unicode61', "
            f"content='{view}', content_rowid='id', detail=none)",
            f"INSERT INTO {table}({table}, rank) VALUES ('automerge', 2)",
            f"INSERT INTO {table}(rowid, body, run_id, source, ref) "
            f"SELECT id, body, run_id, source, ref FROM {view}",
        ):
            db.execute(statement)


_SPILL_TEXT = (
    "COALESCE({row}.content, (SELECT t.content FROM tool_events t WHERE t.id = {row}.event_id))"
)
"""A spill's text: its own, or that of the finished tool event it refers to (``event_id``)."""


def _v11_spill_refs(db: sqlite_utils.Database) -> None:
    """A spilled tool output stored once: a spill whose text equals its call's finished
    event keeps no copy, only the event's id (``event_id``; ``content`` is NULL). The
    spill index reads that event's text. Rows stored so far keep their own copy."""
    db.table("spills").add_column("event_id", int)
    for statement in (
        "DROP TRIGGER history_fts_spills",
        "DROP VIEW history_spills",
        f"CREATE VIEW history_spills AS SELECT s.rowid AS id, {_SPILL_TEXT.format(row='s')} "
        "AS body, s.run_id AS run_id, 'spill' AS source, s.handle AS ref FROM spills s",
        "CREATE TRIGGER history_fts_spills AFTER INSERT ON spills BEGIN "
        "INSERT INTO history_spill_fts(rowid, body, run_id, source, ref) "
        f"VALUES (new.rowid, {_SPILL_TEXT.format(row='new')}, new.run_id, 'spill', "
        "new.handle); END",
    ):
        db.execute(statement)


_V12_TABLES = {
    "meta": "key TEXT PRIMARY KEY, value TEXT",
    "sessions": "id TEXT PRIMARY KEY, created REAL, kind TEXT, entry TEXT, task TEXT, "
    "source TEXT, definition TEXT",
    "leases": "session_id TEXT PRIMARY KEY, owner TEXT, host TEXT, pid INTEGER, expires REAL",
    "run_ends": "run_id TEXT PRIMARY KEY, status TEXT, output TEXT, error TEXT, finished REAL",
    "blobs": "digest TEXT PRIMARY KEY, data TEXT, size INTEGER, created REAL",
}
"""Tables keyed by a text id, rebuilt ``WITHOUT ROWID``: the key is the table's own order,
so no second b-tree (the automatic index of the key) repeats every id."""


def _v12_lean_keys(db: sqlite_utils.Database) -> None:
    """Fewer b-trees holding the same data: the text-keyed tables ``WITHOUT ROWID``; a
    call's outcome keyed by its call (``call_id`` is the rowid: no unique index beside it);
    the history indexes without their per-row size table (``columnsize=0``: a search reads
    the rows it matches anyway). Rows are copied as they are; the indexes are rebuilt."""
    for table, columns in _V12_TABLES.items():
        names = ", ".join(column.split()[0] for column in columns.split(", "))
        for statement in (
            f"CREATE TABLE {table}_v12 ({columns}) WITHOUT ROWID",
            f"INSERT INTO {table}_v12 ({names}) SELECT {names} FROM {table}",
            f"DROP TABLE {table}",
            f"ALTER TABLE {table}_v12 RENAME TO {table}",
        ):
            db.execute(statement)
    outcome = (
        "call_id, status, error_type, error, response_id, model, stop_reason, usage, "
        "message_seq, created"
    )
    for statement in (
        "CREATE TABLE call_outcomes_v12 (call_id INTEGER PRIMARY KEY, status TEXT, "
        "error_type TEXT, error TEXT, response_id TEXT, model TEXT, stop_reason TEXT, "
        "usage TEXT, message_seq INTEGER, created REAL)",
        f"INSERT INTO call_outcomes_v12 ({outcome}) SELECT {outcome} FROM call_outcomes "
        "ORDER BY call_id",
        "DROP TABLE call_outcomes",
        "ALTER TABLE call_outcomes_v12 RENAME TO call_outcomes",
    ):
        db.execute(statement)
    for table, view in (
        ("history_fts", "history_messages"),
        ("history_spill_fts", "history_spills"),
    ):
        for statement in (
            f"DROP TABLE {table}",
            f"CREATE VIRTUAL TABLE {table} USING fts5(body, run_id UNINDEXED, "
            "source UNINDEXED, ref UNINDEXED, tokenize='unicode61', "
            f"content='{view}', content_rowid='id', detail=none, columnsize=0)",
            f"INSERT INTO {table}({table}, rank) VALUES ('automerge', 2)",
            f"INSERT INTO {table}(rowid, body, run_id, source, ref) "
            f"SELECT id, body, run_id, source, ref FROM {view}",
        ):
            db.execute(statement)


def _v13_index_per_transaction(db: sqlite_utils.Database) -> None:
    """The history indexes are filled once per write transaction, just before it commits
    (``_index.index_new_rows``), instead of by a trigger per row: a trigger's FTS5 insert
    flushed a segment at every savepoint of a group-committed batch. Every row written so
    far is indexed already: the marks (``meta``) start at the highest rowids."""
    for statement in (
        "DROP TRIGGER history_fts_messages",
        "DROP TRIGGER history_fts_spills",
        "INSERT OR REPLACE INTO meta(key, value) VALUES "
        "('history_indexed', (SELECT COALESCE(MAX(id), 0) FROM messages)), "
        "('history_spills_indexed', (SELECT COALESCE(MAX(rowid), 0) FROM spills))",
    ):
        db.execute(statement)


_ONE_BLOCK_TEXT = """CAST((
    CASE WHEN json_extract({row}.content, '$[0].ref') = 'tool_event' THEN (
        SELECT t.content FROM tool_events t
        WHERE t.run_id = {row}.run_id
          AND t.call_id = json_extract({row}.content, '$[0].tool_use_id')
          AND t.event = 'finished'
        ORDER BY t.id DESC LIMIT 1)
    ELSE COALESCE(
        json_extract({row}.content, '$[0].text'),
        json_extract({row}.content, '$[0].content'),
        json_extract({row}.content, '$[0].name') || ' ' || json_extract({row}.content, '$[0].input')
    ) END) AS TEXT)"""
"""``_MESSAGE_TEXT_REFS`` of a message with one block, read from the content itself: the
same text (``group_concat`` of one value is that value as text), without ``json_each``'s
walk and a second parse of the block."""


def _v14_one_block_text(db: sqlite_utils.Database) -> None:
    """The history view reads a one-block message (most are: a text, a tool call, a tool
    result) straight from its content: a third less of the index fill's cost. Its text is
    the same for every row, so the index is not rebuilt (FTS5 checks an external-content
    index against what the view reads)."""
    many = _MESSAGE_TEXT_REFS.format(result=_RESULT_TEXT.format(row="m"), row="m")
    text = (
        f"CASE WHEN json_array_length(m.content) = 1 THEN {_ONE_BLOCK_TEXT.format(row='m')} "
        f"ELSE {many} END"
    )
    for statement in (
        "DROP VIEW history_messages",
        f"CREATE VIEW history_messages AS SELECT m.id AS id, {text} AS body, "
        "m.run_id AS run_id, 'message' AS source, m.seq AS ref "
        "FROM messages m WHERE m.kind = 'message'",
    ):
        db.execute(statement)


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [
    _v1,
    _v2_call_prefix,
    _v3_history_search,
    _v4_run_spans,
    _v5_history_search_external,
    _v6_content_blobs,
    _v7_context_limits,
    _v8_budgets,
    _v9_tool_result_refs,
    _v10_lean_history_index,
    _v11_spill_refs,
    _v12_lean_keys,
    _v13_index_per_transaction,
    _v14_one_block_text,
]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(db: sqlite_utils.Database, current: int) -> None:
    """Apply every migration after ``current`` (0 for a new database)."""
    for version in range(current, SCHEMA_VERSION):
        MIGRATIONS[version](db)
