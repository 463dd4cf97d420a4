"""History is appended, never rewritten; a failing write leaves nothing behind."""

from __future__ import annotations

import pytest

from anabranch.errors import StoreError
from anabranch.store import MessageRecord, SnapshotRecord, Store
from tests.store_conformance.conftest import add_run, add_session

pytestmark = pytest.mark.anyio


def _message(seq: int, text: str) -> MessageRecord:
    return MessageRecord(
        run_id="run_1", seq=seq, role="user", content=f'[{{"type": "text", "text": "{text}"}}]'
    )


async def test_a_message_is_never_overwritten(store: Store) -> None:
    await add_session(store)
    await add_run(store)
    await store.append_messages([_message(0, "first")])
    with pytest.raises(StoreError):
        await store.append_messages([_message(0, "second")])
    (message,) = await store.load_messages("run_1")
    assert "first" in message.content


async def test_a_failing_write_leaves_none_of_its_rows(store: Store) -> None:
    await add_session(store)
    await add_run(store)
    await store.append_messages([_message(0, "a")])
    with pytest.raises(StoreError):  # the second row collides: the first must go too
        await store.append_messages([_message(1, "b"), _message(0, "c")])
    assert [m.seq for m in await store.load_messages("run_1")] == [0]
    await store.append_messages([_message(1, "b")])  # and the store is still usable
    assert [m.seq for m in await store.load_messages("run_1")] == [0, 1]


async def test_statuses_are_appended_and_the_latest_wins(store: Store) -> None:
    await add_session(store)
    await add_run(store)
    await store.set_session_status("ses_1", "failed", error="boom")
    await store.set_session_status("ses_1", "done", output="ok")
    session = await store.get_session("ses_1")
    assert session is not None
    assert (session.status, session.output, session.error) == ("done", "ok", None)
    await store.finish_run("run_1", "done", output="answer")
    run = await store.get_run("run_1")
    assert run is not None and (run.status, run.output) == ("done", "answer")


async def test_a_snapshot_version_is_written_once(store: Store) -> None:
    await add_session(store)
    await add_run(store)
    first = SnapshotRecord(run_id="run_1", version=1, system='["a"]', tools="[]", created=1.0)
    await store.save_snapshot(first)
    with pytest.raises(StoreError):
        await store.save_snapshot(
            SnapshotRecord(run_id="run_1", version=1, system='["b"]', tools="[]", created=2.0)
        )
    assert [s.system for s in await store.list_snapshots("run_1")] == ['["a"]']
