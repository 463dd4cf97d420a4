"""Group commit: concurrent writes share transactions, yet each is atomic and isolated."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from anabranch.errors import StoreError
from anabranch.store import MessageRecord, Store
from tests.store_conformance.conftest import Backend, add_run, add_session

pytestmark = pytest.mark.anyio

WRITERS = 64


def _message(seq: int, text: str = "") -> MessageRecord:
    return MessageRecord(
        run_id="run_1", seq=seq, role="user", content=f'[{{"type": "text", "text": "{text}"}}]'
    )


async def test_concurrent_writes_share_transactions(backend: Backend) -> None:
    store = await backend.open()
    await add_session(store)
    await add_run(store)
    before = backend.commits()

    async def append(seq: int) -> None:
        await store.append_messages([_message(seq)])

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for seq in range(WRITERS):
                group.start_soon(append, seq)
    transactions = backend.commits() - before
    # the first writer commits alone; everyone who queued meanwhile shares the next one
    assert 1 <= transactions <= WRITERS // 8, f"{WRITERS} writes took {transactions} commits"
    other = await backend.open()
    assert [m.seq for m in await other.load_messages("run_1")] == list(range(WRITERS))


async def test_a_lone_write_is_committed_at_once(backend: Backend) -> None:
    store = await backend.open()
    await add_session(store)
    before = backend.commits()
    await add_run(store)
    assert backend.commits() - before == 1


async def test_a_failing_write_rolls_back_alone(store: Store) -> None:
    await add_session(store)
    await add_run(store)
    outcomes: dict[int, str] = {}

    async def append(index: int, seq: int) -> None:
        # two messages per write: a duplicate seq must undo both of that write's rows
        records = [_message(seq, str(index)), _message(1000 + index)]
        try:
            await store.append_messages(records)
            outcomes[index] = "ok"
        except StoreError:
            outcomes[index] = "duplicate"

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for index in range(50):
                group.start_soon(append, index, index % 25)  # seqs 0..24, each twice
    assert sorted(outcomes.values()).count("duplicate") == 25
    committed = [m.seq for m in await store.load_messages("run_1")]
    assert [s for s in committed if s < 1000] == list(range(25))
    ok = sorted(1000 + i for i, outcome in outcomes.items() if outcome == "ok")
    assert [s for s in committed if s >= 1000] == ok  # a failed write left no half


async def test_a_cancelled_writer_still_commits_its_whole_write(store: Store) -> None:
    await add_session(store)
    await add_run(store)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(store.append_messages, [_message(seq) for seq in range(3)])
            group.start_soon(store.append_messages, [_message(9)])
            await anyio.lowlevel.checkpoint()
            group.cancel_scope.cancel()
    assert [m.seq for m in await store.load_messages("run_1")] == [0, 1, 2, 9]
