"""SQLite schema v12 keeps the same data in fewer b-trees: text-keyed tables ``WITHOUT
ROWID``, a call's outcome keyed by its call, the history index without its size table, hex
ids as the bytes they spell. A file written before it reads back exactly as it was."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from pathlib import Path

import pytest
import sqlite_utils

from anabranch.errors import StoreError
from anabranch.store import SQLiteStore
from anabranch.store.sqlite._schema import APP_ID, MIGRATIONS

pytestmark = pytest.mark.anyio

FINGERPRINT = "ab" * 32
IMAGE = [{"type": "image", "media_type": "image/png", "blob": "sha256:feed"}]
STORED_IMAGE = json.dumps(IMAGE, separators=(",", ":"))
"""An image block as the file keeps it: its payload in ``blobs``, by digest."""


def _v11_file(path: Path) -> None:
    """A file as anabranch wrote it at schema v11: a finished session, a call and its
    outcome, a held lease, a stored image, a message to search."""
    db = sqlite_utils.Database(path)
    for migration in MIGRATIONS[:11]:
        migration(db)
    conn = db.conn
    conn.executescript(
        f"""
        INSERT INTO meta(key, value) VALUES ('app', '{APP_ID}'), ('schema_version', '11');
        INSERT INTO sessions(id, created, kind, entry, task) VALUES ('ses_1', 1, 'agent', 'a', 't');
        INSERT INTO session_events(session_id, status, output, created)
            VALUES ('ses_1', 'done', 'kept', 2);
        INSERT INTO runs(id, session_id, agent_name, model, depth, mode, created)
            VALUES ('run_1', 'ses_1', 'a', 'm', 0, 'agent', 1);
        INSERT INTO run_ends(run_id, status, output, finished) VALUES ('run_1', 'done', 'ok', 3);
        INSERT INTO calls(run_id, turn, attempt, fingerprint, message_count, created)
            VALUES ('run_1', 1, 1, '{FINGERPRINT}', 1, 1.5);
        INSERT INTO call_outcomes(call_id, status, usage, message_seq, created)
            VALUES (1, 'ok', '{{"input_tokens":7}}', 1, 1.6);
        INSERT INTO messages(run_id, seq, role, content, kind, created) VALUES
            ('run_1', 0, 'user', '[{{"type":"text","text":"manatees graze slowly"}}]',
             'message', 1);
        INSERT INTO blobs(digest, data, size, created) VALUES ('sha256:feed', 'iVBO', 3, 1);
        INSERT INTO spills(handle, run_id, call_id, content, created)
            VALUES ('h.attachments', 'run_1', 'toolu_1', '{STORED_IMAGE}', 1);
        """
    )
    conn.execute(
        "INSERT INTO leases(session_id, owner, host, pid, expires) VALUES (?, ?, ?, ?, ?)",
        ("ses_1", "owner_1", socket.gethostname(), os.getpid(), time.time() + 600),
    )
    conn.commit()
    db.close()


async def test_a_v11_file_reads_back_as_it_was_after_the_migration(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _v11_file(path)
    store = await SQLiteStore.open(path)
    try:
        session = await store.get_session("ses_1")
        assert session is not None and (session.status, session.output) == ("done", "kept")
        run = await store.get_run("run_1")
        assert run is not None and (run.status, run.output) == ("done", "ok")
        [call] = await store.list_calls("run_1")
        assert (call.fingerprint, call.status, call.usage) == (
            FINGERPRINT,
            "ok",
            '{"input_tokens":7}',
        )
        assert await store.lease_holder("ses_1") == "owner_1"
        image = json.loads(await store.get_spill("h.attachments") or "[]")
        assert image[0]["data"] == "iVBO"  # the blob is still found by its digest
        assert [h.ref for h in await store.search_history("run_1", "manatees")] == ["0"]
        assert call.id is not None
        with pytest.raises(StoreError, match="UNIQUE"):  # one outcome per call, as before
            await store.finish_call(call.id, status="ok")
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        names = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
    assert "idx_call_outcomes_call_id" not in names
    assert not {n for n in names if n.startswith("sqlite_autoindex_")} - {
        "sqlite_autoindex_runs_1",
        "sqlite_autoindex_spills_1",
    }
    assert "history_fts_docsize" not in names


async def test_hex_ids_are_kept_as_bytes_and_read_back_as_hex(tmp_path: Path) -> None:
    async with await SQLiteStore.open(tmp_path / "new.db") as store:
        await store.add_run_span(
            "ses_1", "run_1", "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
        )
        assert await store.run_spans("run_1") == [
            ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
        ]
    with sqlite3.connect(tmp_path / "new.db") as conn:
        stored = conn.execute("SELECT trace_id, span_id FROM run_spans").fetchone()
    assert stored == (
        bytes.fromhex("0af7651916cd43dd8448eb211c80319c"),
        bytes.fromhex("b7ad6b7169203331"),
    )
