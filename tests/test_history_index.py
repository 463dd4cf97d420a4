"""The history search index reads text from messages and spills; it keeps no copy of it."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import anyio
import pytest

from anabranch.store import MessageRecord, RunRecord, SessionRecord, SQLiteStore

pytestmark = pytest.mark.anyio


async def test_search_finds_messages_and_spills_without_a_second_copy(tmp_path: Path) -> None:
    async with await SQLiteStore.open(tmp_path / "db") as store:
        await store.create_session(
            SessionRecord(id="ses_1", created=time.time(), kind="agent", entry="a", task="t")
        )
        for run_id in ("run_1", "run_2"):
            await store.create_run(
                RunRecord(id=run_id, session_id="ses_1", agent_name="a", model="m", created=1.0)
            )
        await store.append_messages(
            [
                MessageRecord(
                    run_id="run_1",
                    seq=0,
                    role="user",
                    content='[{"type": "text", "text": "the vault code is zebra"}]',
                ),
                MessageRecord(
                    run_id="run_2",
                    seq=0,
                    role="user",
                    content='[{"type": "text", "text": "zebra elsewhere"}]',
                ),
            ]
        )
        await store.save_spill("out_1", "run_1", "toolu_1", "a long output about a zebra")
        hits = await store.search_history("run_1", "zebra")
        tables = await store.query("SELECT name FROM sqlite_master WHERE name LIKE 'history%'")
    assert sorted((h.source, h.ref) for h in hits) == [("message", "0"), ("spill", "out_1")]
    assert all("[zebra]" in h.snippet for h in hits)
    names = {t["name"] for t in tables}
    assert "history_fts" in names and "history_spill_fts" in names
    assert "history_fts_content" not in names  # external content: the text lives once


def _message(run_id: str, seq: int, text: str) -> MessageRecord:
    return MessageRecord(
        run_id=run_id, seq=seq, role="user", content=f'[{{"type": "text", "text": "{text}"}}]'
    )


async def _two_sessions(store: SQLiteStore) -> None:
    for session_id, run_id in (("ses_1", "run_1"), ("ses_2", "run_2")):
        await store.create_session(
            SessionRecord(id=session_id, created=time.time(), kind="agent", entry="a", task="t")
        )
        await store.create_run(
            RunRecord(id=run_id, session_id=session_id, agent_name="a", model="m", created=1.0)
        )


async def _in_one_batch(store: SQLiteStore, *writes: Callable[[], Awaitable[object]]) -> None:
    """Run ``writes`` so that all but the first share one transaction, in order: the first
    leads a commit held open (the connection is busy) while the others queue behind it."""
    errors: list[Exception] = []

    async def write(fn: Callable[[], Awaitable[object]]) -> None:
        try:
            await fn()
        except Exception as error:  # a write meant to fail
            errors.append(error)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            async with store._sql._limiter:  # the leader's commit waits for the connection
                group.start_soon(write, writes[0])
                await anyio.wait_all_tasks_blocked()
                for fn in writes[1:]:  # queued in this order (trio starts tasks in any)
                    group.start_soon(write, fn)
                    await anyio.wait_all_tasks_blocked()


async def _index_is_sound(store: SQLiteStore) -> None:
    await store._sql.lookup(
        lambda conn: [
            conn.execute(f"INSERT INTO {table}({table}) VALUES ('integrity-check')")
            for table in ("history_fts", "history_spill_fts")
        ]
    )


async def test_rows_committed_together_are_all_searchable_but_a_failed_writes(
    tmp_path: Path,
) -> None:
    """A batch's messages and spills are indexed once, before it commits; a write that
    fails in the batch (a duplicate seq: the batch runs again, each write apart) leaves
    nothing in the index."""
    async with await SQLiteStore.open(tmp_path / "db") as store:
        await _two_sessions(store)
        await store.append_messages([_message("run_1", 0, "first")])
        commits: list[str] = []
        store._sql._conn.set_trace_callback(
            lambda sql: commits.append(sql) if sql.startswith("COMMIT") else None
        )
        await _in_one_batch(
            store,
            lambda: store.append_messages([_message("run_1", 1, "leader")]),
            *(
                partial(store.append_messages, [_message("run_1", seq, f"walrus{seq}")])
                for seq in range(2, 8)
            ),
            lambda: store.append_messages([_message("run_1", 0, "duplicate zebra")]),
            lambda: store.save_spill("out_1", "run_1", "toolu_1", "spilled walrus3 output"),
        )
        store._sql._conn.set_trace_callback(None)
        assert len(commits) == 2  # the leader's, then the other eight together
        for seq in range(2, 8):
            hits = await store.search_history("run_1", f"walrus{seq}")
            refs = sorted(h.ref for h in hits)
            assert refs == ([str(seq), "out_1"] if seq == 3 else [str(seq)])
        assert await store.search_history("run_1", "zebra") == []
        assert [h.ref for h in await store.search_history("run_1", "leader")] == ["1"]
        await _index_is_sound(store)


async def test_deleting_a_session_in_the_batch_that_wrote_to_it(tmp_path: Path) -> None:
    """Rows written earlier in the same transaction are indexed before the deletion tells
    the index to forget them (telling an external-content index to forget a row it never
    held corrupts it)."""
    async with await SQLiteStore.open(tmp_path / "db") as store:
        await _two_sessions(store)
        await store.append_messages([_message("run_2", 0, "older walrus")])
        await _in_one_batch(
            store,
            lambda: store.append_messages([_message("run_1", 0, "walrus kept")]),
            lambda: store.append_messages([_message("run_2", 1, "newer walrus")]),
            lambda: store.save_spill("out_2", "run_2", "toolu_1", "spilled walrus"),
            lambda: store.delete_session("ses_2"),
            lambda: store.append_messages([_message("run_1", 1, "walrus after")]),
        )
        await _index_is_sound(store)
        assert await store.search_history("run_2", "walrus") == []
        hits = await store.search_history("run_1", "walrus")
        assert sorted(h.ref for h in hits) == ["0", "1"]


async def test_rows_written_without_the_store_are_indexed_by_its_next_write(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db"
    async with await SQLiteStore.open(path) as store:
        await _two_sessions(store)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(
            "INSERT INTO messages(run_id, seq, role, content, kind, created) "
            "VALUES ('run_1', 0, 'user', '[{\"type\":\"text\",\"text\":\"quokka\"}]', 'message', 0)"
        )
    conn.close()
    async with await SQLiteStore.open(path) as store:
        await store.append_messages([_message("run_2", 0, "anything")])
        assert [h.ref for h in await store.search_history("run_1", "quokka")] == ["0"]
        await _index_is_sound(store)
