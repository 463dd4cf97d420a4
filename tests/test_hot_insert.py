"""The SQLite store's hot inserts (``HotInsert``) bind a row's values in the order of its
row function's keys: the two must list the same columns in the same order, or values
would land in the wrong columns. A row whose payload column holds an image still has it
moved to ``blobs``, as ``insert`` does."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from anabranch.store import CallRecord, MessageRecord, ToolEventRecord
from anabranch.store._rows import call_outcome_rows, message_row, run_end_row, tool_event_row
from anabranch.store.sqlite._open import open_connection
from anabranch.store.sqlite._rows import (
    INSERT_CALL,
    INSERT_MESSAGE,
    INSERT_OUTCOME,
    INSERT_RUN_END,
    INSERT_TOOL_EVENT,
    OUTCOME_COLUMNS,
    HotInsert,
    call_values,
    fetch_rows,
    insert,
)


def _columns(hot: HotInsert) -> tuple[str, ...]:
    inside = hot.sql.split("(", 1)[1].split(")", 1)[0]
    return tuple(inside.split(", "))


def test_each_hot_insert_lists_its_row_functions_keys_in_order() -> None:
    message = MessageRecord(run_id="run_1", seq=0, role="user", content="[]")
    event = ToolEventRecord(
        run_id="run_1", call_id="toolu_1", name="t", event="started", created=1.0
    )
    call = CallRecord(
        run_id="run_1", turn=1, attempt=1, fingerprint="ab", message_count=1, created=1.0
    )
    assert _columns(INSERT_MESSAGE) == tuple(message_row(message))
    assert _columns(INSERT_TOOL_EVENT) == tuple(tool_event_row(event))
    assert _columns(INSERT_CALL) == tuple(call_values(call))
    assert _columns(INSERT_RUN_END) == tuple(run_end_row("run_1", "out"))
    outcome, _ = call_outcome_rows(
        1,
        status="ok",
        message=message,
        error_type=None,
        error=None,
        response_id=None,
        model=None,
        stop_reason=None,
        usage=None,
        run_output=None,
    )
    assert _columns(INSERT_OUTCOME) == OUTCOME_COLUMNS == tuple(outcome)


@pytest.fixture
def conn(tmp_path: Path) -> sqlite3.Connection:
    return open_connection(tmp_path / "s.db", True, "FULL")


def test_a_hot_row_with_an_image_stores_its_payload_once_as_insert_does(
    conn: sqlite3.Connection,
) -> None:
    image = '[{"type": "image", "media_type": "image/png", "data": "aGVsbG8="}]'
    insert(conn, "sessions", {"id": "ses_1", "created": 1, "kind": "agent", "entry": "a"})
    insert(conn, "runs", {"id": "run_1", "session_id": "ses_1", "agent_name": "a", "created": 1})
    first = MessageRecord(run_id="run_1", seq=0, role="user", content=image, created=1.0)
    INSERT_MESSAGE(conn, message_row(first))
    insert(conn, "messages", message_row(replace(first, seq=1)))
    stored = conn.execute("SELECT content FROM messages ORDER BY seq").fetchall()
    assert stored[0] == stored[1] and "aGVsbG8" not in stored[0][0]
    assert conn.execute("SELECT COUNT(*) FROM blobs").fetchone() == (1,)
    read = fetch_rows(conn, "SELECT content FROM messages ORDER BY seq")
    assert "aGVsbG8=" in read[0]["content"]
