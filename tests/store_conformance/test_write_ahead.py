"""Write-ahead ordering: what the runtime relies on to resume a crashed session."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Literal

import anyio
import pytest

from anabranch import Agent, Runtime
from anabranch.errors import StoreError
from anabranch.store import (
    CallRecord,
    MessageRecord,
    RunRecord,
    SnapshotRecord,
    SpillRecord,
    Store,
    ToolEventRecord,
)
from anabranch.testing import TestModel
from tests.store_conformance.conftest import Backend, add_run, add_session

pytestmark = pytest.mark.anyio


def _message(
    seq: int, role: Literal["user", "assistant"] = "user", text: str = "hi"
) -> MessageRecord:
    return MessageRecord(
        run_id="run_1", seq=seq, role=role, content=f'[{{"type": "text", "text": "{text}"}}]'
    )


def _call(turn: int, message_count: int) -> CallRecord:
    return CallRecord(
        run_id="run_1",
        turn=turn,
        attempt=1,
        fingerprint="f",
        message_count=message_count,
        created=time.time(),
    )


async def test_a_write_is_durable_when_it_returns(backend: Backend) -> None:
    writer = await backend.open()
    await add_session(writer)
    snapshot = SnapshotRecord(run_id="run_1", version=1, system="[]", tools="[]", created=1.0)
    await writer.create_run(
        RunRecord(id="run_1", session_id="ses_1", agent_name="a", model="m", created=1.0),
        snapshot=snapshot,
        messages=[_message(0)],
    )
    reader = await backend.open()  # another connection, the writer still open
    run = await reader.get_run("run_1")
    assert run is not None and run.status == "running"
    assert [m.seq for m in await reader.load_messages("run_1")] == [0]
    latest = await reader.latest_snapshot("run_1")
    assert latest is not None and latest.version == 1


async def test_a_call_is_committed_before_it_is_sent(backend: Backend) -> None:
    store = await backend.open()
    await add_session(store)
    await add_run(store)
    await store.append_messages([_message(0)])
    call_id = await store.begin_call(_call(1, 2), [_message(1, text="pending")])

    other = await backend.open()  # what a process resuming after a crash here would see
    calls = await other.list_calls("run_1")
    assert [(c.id, c.status) for c in calls] == [(call_id, None)]  # in flight
    assert [m.seq for m in await other.load_messages("run_1")] == [0, 1]
    interrupted = await other.close_interrupted_calls("run_1")
    assert [c.id for c in interrupted] == [call_id]
    assert [c.status for c in await store.list_calls("run_1")] == ["interrupted"]
    assert await other.close_interrupted_calls("run_1") == []  # closed once


async def test_a_call_outcome_commits_with_its_message_and_tool_events(store: Store) -> None:
    await add_session(store)
    await add_run(store)
    call_id = await store.begin_call(_call(1, 1), [_message(0)])
    started = ToolEventRecord(
        run_id="run_1", call_id="toolu_1", name="search", event="started", created=time.time()
    )
    await store.finish_call(
        call_id,
        status="ok",
        message=_message(1, role="assistant", text="calling"),
        usage='{"input_tokens": 7, "output_tokens": 3}',
        tool_events=[started],
    )
    (call,) = await store.list_calls("run_1")
    assert (call.status, call.message_seq) == ("ok", 1)
    assert await store.last_ok_turn("run_1") == 1
    assert await store.next_seq("run_1") == 2
    events = await store.tool_events("run_1", ["toolu_1"])
    assert [(e.name, e.event) for e in events] == [("search", "started")]
    usage = await store.sum_call_usage("ses_1", ["input_tokens", "output_tokens"])
    assert usage == {"input_tokens": 7, "output_tokens": 3}


async def test_an_answer_commits_with_its_run_end(backend: Backend) -> None:
    store = await backend.open()
    await add_session(store)
    await add_run(store)
    call_id = await store.begin_call(_call(1, 1), [_message(0)])
    before = backend.commits()
    await store.finish_call(
        call_id,
        status="ok",
        message=_message(1, role="assistant", text="the answer"),
        run_output="the answer",
    )
    assert backend.commits() - before == 1  # the outcome, the message and the run's end
    run = await (await backend.open()).get_run("run_1")
    assert run is not None
    assert (run.status, run.output, run.error) == ("done", "the answer", None)
    assert run.finished is not None


async def test_a_failing_answer_leaves_the_run_running(store: Store) -> None:
    await add_session(store)
    await add_run(store)
    call_id = await store.begin_call(_call(1, 1), [_message(0)])
    with pytest.raises(StoreError):  # seq 0 is taken: the whole transaction fails
        await store.finish_call(
            call_id, status="ok", message=_message(0, role="assistant"), run_output="hi"
        )
    run = await store.get_run("run_1")
    assert run is not None and run.status == "running"
    (call,) = await store.list_calls("run_1")
    assert call.status is None


async def test_a_run_starts_with_its_first_drives_span_row(backend: Backend) -> None:
    store = await backend.open()
    await add_session(store)
    before = backend.commits()
    trace, span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    await store.create_run(
        RunRecord(id="run_1", session_id="ses_1", agent_name="a", model="m", created=1.0),
        messages=[_message(0)],
        span=(trace, span),
    )
    assert backend.commits() == before + 1  # the run, its messages and the link: one commit
    assert await store.run_spans("run_1") == [(trace, span)]
    with pytest.raises(StoreError):  # run_1 exists: nothing of this transaction is kept
        await store.create_run(
            RunRecord(id="run_1", session_id="ses_1", agent_name="a", model="m", created=2.0),
            span=("1" * 32, "2" * 16),
        )
    assert await store.run_spans("run_1") == [(trace, span)]


async def test_a_run_starts_with_its_first_call_row(backend: Backend) -> None:
    """``create_run(call=)``: the run, its task and its first call's row in one commit,
    the row as ``begin_call`` writes it (in flight until finished); a crash after that
    commit leaves a run whose call ``close_interrupted_calls`` closes, as after
    ``begin_call``; a failed one keeps neither the run nor the call."""
    store = await backend.open()
    await add_session(store)
    before = backend.commits()
    run = RunRecord(id="run_1", session_id="ses_1", agent_name="a", model="m", created=1.0)
    call_id = await store.create_run(run, messages=[_message(0)], call=_call(1, 1))
    assert backend.commits() == before + 1
    other = await backend.open()  # what a process resuming after a crash here would see
    (call,) = await other.list_calls("run_1")
    assert (call.id, call.turn, call.message_count, call.status) == (call_id, 1, 1, None)
    assert [m.seq for m in await other.load_messages("run_1")] == [0]
    await store.finish_call(call_id, status="ok", message=_message(1, role="assistant"))
    assert [c.status for c in await other.list_calls("run_1")] == ["ok"]
    assert await store.create_run(replace(run, id="run_2")) == 0  # no call: no id
    with pytest.raises(StoreError):  # run_1 exists: nothing of this transaction is kept
        await store.create_run(run, call=_call(1, 1))
    assert len(await store.list_calls("run_1")) == 1


async def test_a_finished_tool_event_is_read_back_whole(store: Store) -> None:
    await add_session(store)
    await add_run(store)
    finished = ToolEventRecord(
        run_id="run_1",
        call_id="toolu_1",
        name="search",
        event="finished",
        created=time.time(),
        content="x" * 100_000 + "\u2603",
        is_error=True,
    )
    await store.record_tool_event(finished)
    (event,) = await store.tool_events("run_1", ["toolu_1", "toolu_other"])
    assert event.content == finished.content and event.is_error is True


def _finished(content: str) -> ToolEventRecord:
    return ToolEventRecord(
        run_id="run_1",
        call_id="toolu_1",
        name="search",
        event="finished",
        created=time.time(),
        content=content,
    )


async def test_a_last_result_commits_with_its_spill_and_results_message(backend: Backend) -> None:
    store = await backend.open()
    await add_session(store)
    await add_run(store)
    output = "walrus tusks " * 2000
    spill = SpillRecord("spill_toolu_1", "run_1", "toolu_1", output, time.time())
    results = MessageRecord(
        run_id="run_1",
        seq=0,
        role="user",
        content='[{"type": "tool_result", "tool_use_id": "toolu_1", "ref": "tool_event"}]',
    )
    before = backend.commits()
    await store.record_tool_event(_finished(output), spills=[spill], messages=[results])
    assert backend.commits() - before == 1  # event, spill and message: one transaction
    reader = await backend.open()
    (event,) = await reader.tool_events("run_1", ["toolu_1"])
    assert event.content == output
    assert await reader.get_spill("spill_toolu_1") == output  # the event's text
    (message,) = await reader.load_messages("run_1")
    assert (message.seq, message.role) == (0, "user")
    hits = await reader.search_history("run_1", "walrus tusks")
    assert {hit.source for hit in hits} >= {"spill"}


async def test_a_last_result_commits_with_its_results_message_and_the_next_call(
    backend: Backend,
) -> None:
    store = await backend.open()
    await add_session(store)
    await add_run(store)
    await store.append_messages([_message(0)])
    output = "narwhal tusks " * 2000
    spill = SpillRecord("spill_toolu_1", "run_1", "toolu_1", output, time.time())
    results = MessageRecord(
        run_id="run_1",
        seq=1,
        role="user",
        content='[{"type": "tool_result", "tool_use_id": "toolu_1", "ref": "tool_event"}]',
    )
    before = backend.commits()
    call_id = await store.begin_call(
        _call(1, 2), [results], tool_event=_finished(output), spills=[spill]
    )
    assert backend.commits() - before == 1  # event, spill, message and call row: one
    reader = await backend.open()
    (event,) = await reader.tool_events("run_1", ["toolu_1"])
    assert event.content == output
    assert await reader.get_spill("spill_toolu_1") == output
    assert [m.seq for m in await reader.load_messages("run_1")] == [0, 1]
    (call,) = await reader.list_calls("run_1")
    assert (call.id, call.turn, call.message_count, call.status) == (call_id, 1, 2, None)
    hits = await reader.search_history("run_1", "narwhal tusks")
    assert {hit.source for hit in hits} >= {"spill"}


async def test_a_failing_next_call_leaves_no_event_and_no_message(store: Store) -> None:
    await add_session(store)
    await add_run(store)
    await store.append_messages([_message(0)])
    with pytest.raises(StoreError):  # seq 0 is taken: the whole transaction fails
        await store.begin_call(
            _call(1, 2), [_message(0, text="again")], tool_event=_finished("result")
        )
    assert await store.tool_events("run_1", ["toolu_1"]) == []
    assert await store.list_calls("run_1") == []
    assert [m.content for m in await store.load_messages("run_1")] == [_message(0).content]


async def test_a_failing_results_message_leaves_no_event(store: Store) -> None:
    await add_session(store)
    await add_run(store)
    await store.append_messages([_message(0)])
    with pytest.raises(StoreError):  # seq 0 is taken: the whole transaction fails
        await store.record_tool_event(_finished("result"), messages=[_message(0, text="again")])
    assert await store.tool_events("run_1", ["toolu_1"]) == []
    assert [m.content for m in await store.load_messages("run_1")] == [_message(0).content]


async def test_a_runtime_runs_on_the_store_it_is_given(backend: Backend) -> None:
    store = await backend.open()
    agent = Agent(name="worker", model="test-model", instructions="Work.")
    with anyio.fail_after(30):
        async with Runtime(store=store, model=TestModel()) as rt:
            result = await rt.run(agent, "say hi")
    session = await store.get_session(result.session_id)  # still open: the caller owns it
    assert session is not None and session.status == "done"
    assert [c.status for c in await store.list_calls(result.run_id)] == ["ok"]
