"""The history view's one-block reading (v14) gives every message the text it had before.

The history index is an external-content FTS5 table over the ``history_messages`` view:
the index holds the words of what the view read when a row was indexed, and a deletion
or a snippet reads the view again. So a new view must read exactly the old text, or a
migrated index no longer matches its content.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils

from anabranch.store import SQLiteStore
from anabranch.store.sqlite._index import index_new_rows
from anabranch.store.sqlite._schema import (
    _MESSAGE_TEXT_REFS,
    _RESULT_TEXT,
    APP_ID,
    MIGRATIONS,
)

pytestmark = pytest.mark.anyio

_FINISHED = {"run_1": {"toolu_1": "the narwhal tool said hello", "toolu_2": "second result"}}

_CONTENTS: list[list[Any]] = [
    [{"type": "text", "text": "a plain narwhal text"}],
    [{"type": "text", "text": "ünïcödé — 日本語 narwhal"}],
    [{"type": "tool_use", "id": "toolu_1", "name": "look", "input": {"q": "narwhal", "n": 2}}],
    [{"type": "tool_result", "tool_use_id": "toolu_1", "ref": "tool_event"}],
    [{"type": "tool_result", "tool_use_id": "toolu_9", "ref": "tool_event"}],  # no event
    [{"type": "tool_result", "tool_use_id": "toolu_3", "content": "inline narwhal result"}],
    [{"type": "tool_result", "tool_use_id": "toolu_4", "content": [{"type": "text", "text": "x"}]}],
    [{"type": "thinking", "thinking": "hidden", "signature": "sig"}],
    [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}],
    [{"type": "text", "text": 42}],
    [{"type": "text", "text": 1.5}],
    [],
    [
        {"type": "text", "text": "two blocks narwhal"},
        {"type": "tool_use", "id": "toolu_2", "name": "look", "input": {}},
    ],
    [
        {"type": "tool_result", "tool_use_id": "toolu_1", "ref": "tool_event"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "ref": "tool_event"},
    ],
]

_OLD_TEXT = _MESSAGE_TEXT_REFS.format(result=_RESULT_TEXT.format(row="m"), row="m")
"""What v9-v13's view read for a message."""


def _make_v13(path: Path) -> None:
    """A v13 file holding every shape above, indexed by the v13 view."""
    db = sqlite_utils.Database(path)
    for migration in MIGRATIONS[:13]:
        migration(db)
    conn = db.conn
    conn.execute(
        "INSERT OR REPLACE INTO meta(key, value) VALUES ('app', ?), ('schema_version', '13')",
        (APP_ID,),
    )
    conn.execute(
        "INSERT INTO sessions(id, created, kind, entry, task) "
        "VALUES ('ses_1', ?, 'agent', 'a', 't')",
        (time.time(),),
    )
    conn.execute(
        "INSERT INTO session_events(session_id, status, created) VALUES ('ses_1', 'running', 1)"
    )
    conn.execute(
        "INSERT INTO runs(id, session_id, agent_name, model, depth, mode, created) "
        "VALUES ('run_1', 'ses_1', 'a', 'm', 0, 'root', 1)"
    )
    for call_id, text in _FINISHED["run_1"].items():
        conn.execute(
            "INSERT INTO tool_events(run_id, call_id, name, event, content, is_error, created) "
            "VALUES ('run_1', ?, 'look', 'finished', ?, 0, 1)",
            (call_id, text),
        )
    for seq, content in enumerate(_CONTENTS):
        conn.execute(
            "INSERT INTO messages(run_id, seq, role, content, kind, created) "
            "VALUES ('run_1', ?, 'user', ?, 'message', 1)",
            (seq, json.dumps(content, ensure_ascii=False)),
        )
    index_new_rows(conn)
    conn.commit()
    db.close()


def _sound(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO history_fts(history_fts) VALUES ('integrity-check')")


async def test_a_migrated_index_matches_the_new_view_and_deletes_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "v13.db"
    _make_v13(path)
    with sqlite3.connect(path) as conn:
        before = conn.execute(
            "SELECT id, body, typeof(body) FROM history_messages ORDER BY id"
        ).fetchall()
    async with await SQLiteStore.open(path) as store:
        after = await store._sql.lookup(
            lambda conn: conn.execute(
                "SELECT id, body, typeof(body) FROM history_messages ORDER BY id"
            ).fetchall()
        )
        assert after == before  # the same text, of the same type, for every shape
        await store._sql.lookup(_sound)  # the index still matches what the view reads
        hits = await store.search_history("run_1", "narwhal", limit=20)
        assert sorted(int(h.ref) for h in hits) == [0, 1, 2, 3, 5, 12, 13]
        await store.delete_session("ses_1")  # its 'delete' commands read the new view
        await store._sql.lookup(_sound)
        assert await store.search_history("run_1", "narwhal", limit=20) == []


async def test_the_new_view_reads_what_the_old_expression_reads(tmp_path: Path) -> None:
    """Rows written and indexed at v14: the view agrees with v13's expression."""
    path = tmp_path / "v13.db"
    _make_v13(path)
    async with await SQLiteStore.open(path) as store:
        rows = await store._sql.lookup(
            lambda conn: conn.execute(
                f"SELECT h.body IS {_OLD_TEXT}, json_array_length(m.content) "
                "FROM history_messages h JOIN messages m ON m.id = h.id ORDER BY h.id"
            ).fetchall()
        )
    assert len(rows) == len(_CONTENTS)
    assert all(same for same, _ in rows)
    assert {length for _, length in rows} == {0, 1, 2}  # both branches are exercised
