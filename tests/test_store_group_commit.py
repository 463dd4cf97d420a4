"""Group commit: concurrent writes share transactions, yet each is atomic and isolated."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from anabranch.store import MessageRecord, RunRecord, SessionRecord, SQLiteStore

pytestmark = pytest.mark.anyio


async def _session(store: SQLiteStore, session_id: str = "ses_1") -> None:
    await store.create_session(
        SessionRecord(id=session_id, created=time.time(), kind="agent", entry="a", task="t")
    )


def _run(run_id: str) -> RunRecord:
    return RunRecord(id=run_id, session_id="ses_1", agent_name="a", model="m", created=1.0)


async def test_concurrent_writes_are_all_committed(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    async with await SQLiteStore.open(path) as store:
        await _session(store)
        await store.create_run(_run("run_1"))

        async def append(seq: int) -> None:
            record = MessageRecord(run_id="run_1", seq=seq, role="user", content="[]")
            await store.append_messages([record])

        async with anyio.create_task_group() as group:
            for seq in range(200):
                group.start_soon(append, seq)
    conn = sqlite3.connect(path)  # a fresh connection sees every write
    seqs = [row[0] for row in conn.execute("SELECT seq FROM messages ORDER BY seq")]
    conn.close()
    assert seqs == list(range(200))


async def test_a_failing_write_rolls_back_alone(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    outcomes: dict[int, str] = {}
    async with await SQLiteStore.open(path) as store:
        await _session(store)
        await store.create_run(_run("run_1"))

        async def append(index: int, seq: int) -> None:
            # two messages per write: a duplicate seq must undo both of that write's rows
            records = [
                MessageRecord(run_id="run_1", seq=seq, role="user", content=f'["{index}"]'),
                MessageRecord(run_id="run_1", seq=1000 + index, role="user", content="[]"),
            ]
            try:
                await store.append_messages(records)
                outcomes[index] = "ok"
            except sqlite3.IntegrityError:
                outcomes[index] = "duplicate"

        async with anyio.create_task_group() as group:
            for index in range(50):
                group.start_soon(append, index, index % 25)  # seqs 0..24, each twice
        rows = await store.query("SELECT seq FROM messages ORDER BY seq")
    assert sorted(outcomes.values()).count("duplicate") == 25
    committed = [r["seq"] for r in rows]
    assert [s for s in committed if s < 1000] == list(range(25))
    ok = sorted(1000 + i for i, outcome in outcomes.items() if outcome == "ok")
    assert [s for s in committed if s >= 1000] == ok  # a failed write left no half


async def test_a_cancelled_writer_still_commits_its_whole_write(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    async with await SQLiteStore.open(path) as store:
        await _session(store)
        await store.create_run(_run("run_1"))
        records = [
            MessageRecord(run_id="run_1", seq=seq, role="user", content="[]") for seq in range(3)
        ]
        async with anyio.create_task_group() as group:
            group.start_soon(store.append_messages, records)
            group.start_soon(
                store.append_messages,
                [MessageRecord(run_id="run_1", seq=9, role="user", content="[]")],
            )
            await anyio.lowlevel.checkpoint()
            group.cancel_scope.cancel()
        rows = await store.query("SELECT seq FROM messages ORDER BY seq")
    assert [r["seq"] for r in rows] == [0, 1, 2, 9]  # queued writes are shielded
