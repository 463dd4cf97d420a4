"""A conversation's next turn: a finished run reopens and gains messages atomically."""

from __future__ import annotations

import pytest

from anabranch.errors import StoreError
from anabranch.store import MessageRecord, Store
from tests.store_conformance.conftest import add_run, add_session

pytestmark = pytest.mark.anyio


def _message(seq: int, text: str) -> MessageRecord:
    return MessageRecord(
        run_id="run_1", seq=seq, role="user", content=f'[{{"type": "text", "text": "{text}"}}]'
    )


async def test_a_finished_run_reopens_with_its_next_message(store: Store) -> None:
    await add_session(store)
    await add_run(store)
    await store.append_messages([_message(0, "first")])
    await store.finish_run("run_1", "done", output="answer")
    await store.continue_run("run_1", [_message(1, "second")])
    run = await store.get_run("run_1")
    assert run is not None and run.status == "running" and run.output is None
    assert [m.seq for m in await store.load_messages("run_1")] == [0, 1]
    await store.finish_run("run_1", "done", output="answer 2")  # and it can finish again
    run = await store.get_run("run_1")
    assert run is not None and run.status == "done" and run.output == "answer 2"


async def test_a_failing_continue_leaves_the_run_finished(store: Store) -> None:
    await add_session(store)
    await add_run(store)
    await store.append_messages([_message(0, "first")])
    await store.finish_run("run_1", "done", output="answer")
    with pytest.raises(StoreError):  # seq 0 exists: nothing of the continue may stay
        await store.continue_run("run_1", [_message(0, "again")])
    run = await store.get_run("run_1")
    assert run is not None and run.status == "done" and run.output == "answer"
