"""``GroupCommitConnection.bounded_lookup``: a read run on the event loop's thread while
it stays within ``LOOKUP_STEPS`` SQLite VM steps, else run again on the worker thread,
with the same result either way; a session's usage is summed so (no thread hop for a
small session, the same sums for a long one)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from anabranch.errors import StoreError
from anabranch.store import CallRecord, MessageRecord, RunRecord, SessionRecord, SQLiteStore
from anabranch.store.sqlite import _group_commit
from anabranch.store.sqlite._group_commit import GroupCommitConnection

pytestmark = pytest.mark.anyio

_COUNT_TO = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every read that hopped to the worker thread."""
    hops: list[Any] = []
    read = GroupCommitConnection.read

    async def counted(self: GroupCommitConnection, fn: Any) -> Any:
        hops.append(fn)
        return await read(self, fn)

    monkeypatch.setattr(GroupCommitConnection, "read", counted)
    return hops


async def test_a_short_read_stays_on_the_loop_a_long_one_hops(
    tmp_path: Path, reads: list[Any]
) -> None:
    async with await SQLiteStore.open(tmp_path / "s.db") as store:
        sql = store._sql

        def count(limit: int) -> Any:
            return lambda conn: conn.execute(
                _COUNT_TO + "SELECT COUNT(*) FROM n", (limit,)
            ).fetchone()

        assert await sql.bounded_lookup(count(10)) == (10,)
        assert reads == []
        assert await sql.bounded_lookup(count(200_000)) == (200_000,)
        assert len(reads) == 1  # given up on the loop's thread, run on the worker thread
        with pytest.raises(StoreError) as raised:
            await sql.bounded_lookup(lambda conn: conn.execute("SELECT * FROM no_such_table"))
        assert isinstance(raised.value.__cause__, sqlite3.OperationalError)
        assert len(reads) == 1  # an error of its own is not run again
        assert await sql.bounded_lookup(count(3)) == (3,)  # the handler is gone


async def _session_with_calls(store: SQLiteStore, calls: int) -> None:
    await store.create_session(
        SessionRecord(id="ses_1", created=1.0, kind="agent", entry="a", task="t")
    )
    await store.create_run(
        RunRecord(id="run_1", session_id="ses_1", agent_name="a", model="m", created=1.0)
    )
    for turn in range(1, calls + 1):
        call = CallRecord(
            run_id="run_1", turn=turn, attempt=1, fingerprint="ab", message_count=1, created=1.0
        )
        call_id = await store.begin_call(call, [])
        answer = MessageRecord(run_id="run_1", seq=turn, role="assistant", content="[]")
        usage = f'{{"input_tokens": {turn}, "output_tokens": 2}}'
        await store.finish_call(call_id, status="ok", message=answer, usage=usage)


@pytest.mark.parametrize("steps", [10_000, 10])
async def test_a_sessions_usage_is_the_same_on_either_thread(
    tmp_path: Path, reads: list[Any], monkeypatch: pytest.MonkeyPatch, steps: int
) -> None:
    monkeypatch.setattr(_group_commit, "LOOKUP_STEPS", steps)
    async with await SQLiteStore.open(tmp_path / "s.db") as store:
        await _session_with_calls(store, 20)
        sums = await store.sum_call_usage("ses_1", ("input_tokens", "output_tokens"))
        by_run = await store.sum_call_usage("ses_1", ("input_tokens",), run_id="run_1")
    assert sums == {"input_tokens": 210, "output_tokens": 40}
    assert by_run == {"input_tokens": 210}
    assert len(reads) == (0 if steps == 10_000 else 2)
