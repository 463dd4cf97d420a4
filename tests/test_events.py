"""The event stream: typed events of a session and its sub-agents, on_event, slow consumers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from anabranch import Agent, AnthropicModel, RetryPolicy, Runtime
from anabranch.errors import ModelAPIError, OverloadedError
from anabranch.events import EVENT_ADAPTER, Event, TextDelta
from anabranch.messages import ModelRequest
from anabranch.runtime._events import Subscription
from anabranch.testing import FunctionModel, MessagesServer, TestModel

from .compaction_helpers import small_agent
from .helpers import failed_with
from .subagent_helpers import first_turn, routed, spawn

pytestmark = pytest.mark.anyio

FAST_RETRY = RetryPolicy(max_attempts=4, base_delay=0.0, max_delay=0.0)
LIFECYCLE = {
    "session_started",
    "run_started",
    "model_call_started",
    "model_call_finished",
    "tool_call_started",
    "tool_call_finished",
    "child_spawned",
    "child_reported",
    "compaction_started",
    "compaction_finished",
    "run_finished",
    "session_finished",
}


def _supervisor_model() -> FunctionModel:
    """A boss that spawns two compacting workers, then reports; workers use TestModel."""
    worker = TestModel(rounds=14)

    def boss(request: ModelRequest) -> object:
        if first_turn(request):
            return [
                spawn("worker", "research tides", call_id="toolu_w1"),
                spawn("worker", "research waves", call_id="toolu_w2"),
            ]
        return "both reports are in"

    return routed(boss=boss, test_model=worker.respond)


def _supervisor() -> Agent:
    return Agent(name="boss", model="boss", subagents=[small_agent("worker")])


async def test_a_supervisors_stream_holds_its_compacting_children_events(tmp_path: Path) -> None:
    async with Runtime(db=tmp_path / "s.db", model=_supervisor_model(), retry=FAST_RETRY) as rt:
        seen: list[Any] = []
        with anyio.fail_after(60):
            async with rt.stream(_supervisor(), "two topics") as events:
                async for event in events:
                    seen.append(event)
            assert events.result is not None and events.result.status == "done"
            runs = {r.id: r for r in await rt.store.list_runs(events.result.session_id)}
    session_id = events.result.session_id
    assert all(isinstance(e, Event) and e.session_id == session_id for e in seen)
    assert seen[0].kind == "session_started" and seen[-1].kind == "session_finished"
    root = next(r for r in runs.values() if r.parent_run_id is None)
    children = [r for r in runs.values() if r.parent_run_id == root.id]
    assert len(children) == 2
    spawned = [e for e in seen if e.kind == "child_spawned"]
    assert {e.child_run_id for e in spawned} == {c.id for c in children}
    assert all(e.run_id == root.id for e in spawned)
    for child in children:
        own = [e for e in seen if e.run_id == child.id]
        assert all(e.parent_run_id == root.id and e.agent == "worker" for e in own)
        kinds = [e.kind for e in own]
        assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
        finished = [e for e in own if e.kind == "compaction_finished"]
        assert finished, "each worker compacts"
        for event in finished:
            assert event.status == "ok" and event.strategy == "summarize"
            assert event.tokens_after < event.tokens_before
            assert event.messages_after < event.messages_before
        # every compaction was announced before its result
        assert kinds.count("compaction_started") == kinds.count("compaction_finished")
        assert own[-1].status == "done"
    reported = [e for e in seen if e.kind == "child_reported"]
    assert {e.child_run_id for e in reported} == {c.id for c in children}
    # each child reported after its own run_finished
    for event in reported:
        done_at = next(
            i
            for i, e in enumerate(seen)
            if e.kind == "run_finished" and e.run_id == event.child_run_id
        )
        assert seen.index(event) > done_at
    # the JSON form parses back to the same typed event
    for event in seen:
        assert EVENT_ADAPTER.validate_json(event.model_dump_json()) == event


async def test_a_slow_on_event_callback_never_holds_the_run_back(tmp_path: Path) -> None:
    """The callback blocks on its first event until the model has answered the run's
    last turn: the run got there without the consumer taking a single event."""
    last_turn_answered = anyio.Event()
    inner = TestModel(rounds=3)
    received: list[Any] = []

    async def answer(request: ModelRequest) -> Any:
        blocks = inner.respond(request)
        if not any(b.type == "tool_use" for b in blocks):
            last_turn_answered.set()
        return blocks

    async def slow(event: Any) -> None:
        await last_turn_answered.wait()
        received.append(event)

    agent = small_agent("solo")
    async with Runtime(db=tmp_path / "slow.db", model=FunctionModel(answer), on_event=slow) as rt:
        with anyio.fail_after(30):
            result = await rt.run(agent, "research moons")
    assert result.status == "done"
    kinds = [e.kind for e in received]
    assert kinds[0] == "session_started" and kinds[-1] == "session_finished"
    assert kinds.count("model_call_finished") == 4  # 3 tool rounds and the answer
    assert kinds.count("tool_call_finished") == 3


async def test_a_lagging_stream_merges_deltas_and_keeps_every_lifecycle_event(
    tmp_path: Path,
) -> None:
    """Real SSE deltas from the SDK; the consumer reads nothing until the run is over."""
    long_answer = " ".join(f"word{i}" for i in range(600))

    def answer(request: ModelRequest) -> object:
        return long_answer

    agent = Agent(name="talker", model="claude-opus-4-8")
    session_over = anyio.Event()

    def watch(event: Any) -> None:  # a second, fast consumer tells when the run is over
        if event.kind == "session_finished":
            session_over.set()

    async with MessagesServer(policy=FunctionModel(answer)) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        try:
            async with Runtime(db=tmp_path / "d.db", model=model, on_event=watch) as rt:
                with anyio.fail_after(30):
                    async with rt.stream(agent, "talk") as events:
                        await session_over.wait()
                        collected = [e async for e in events]
        finally:
            await model.aclose()
    kinds = [e.kind for e in collected]
    for kind in ("session_started", "run_started", "model_call_started", "model_call_finished"):
        assert kinds.count(kind) == 1, kind
    assert kinds[-2:] == ["run_finished", "session_finished"]
    deltas = [e for e in collected if isinstance(e, TextDelta)]
    assert "".join(d.text for d in deltas) == long_answer
    assert len(deltas) == 1 and events.merged_deltas > 0  # merged while nobody read


async def test_a_fast_stream_sees_deltas_as_they_arrive(tmp_path: Path) -> None:
    answer_text = "The tide turns twice a day. " * 30
    agent = Agent(name="talker", model="claude-opus-4-8")
    async with MessagesServer(policy=FunctionModel(lambda r: answer_text)) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        try:
            async with Runtime(db=tmp_path / "f.db", model=model) as rt:
                with anyio.fail_after(30):
                    async with rt.stream(agent, "talk") as events:
                        collected = [e async for e in events]
        finally:
            await model.aclose()
    deltas = [e for e in collected if e.kind == "text_delta"]
    assert "".join(d.text for d in deltas) == answer_text
    started = [i for i, e in enumerate(collected) if e.kind == "model_call_started"][0]
    finished = [i for i, e in enumerate(collected) if e.kind == "model_call_finished"][0]
    assert all(started < collected.index(d) < finished for d in deltas)


async def test_retries_are_events_with_their_cause(tmp_path: Path) -> None:
    agent = Agent(name="solo", model="claude-opus-4-8")
    async with MessagesServer(policy=FunctionModel(lambda r: "fine"), faults=["overloaded"]) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        try:
            async with Runtime(db=tmp_path / "r.db", model=model, retry=FAST_RETRY) as rt:
                with anyio.fail_after(30):
                    async with rt.stream(agent, "go") as events:
                        collected = [e async for e in events]
        finally:
            await model.aclose()
    retries = [e for e in collected if e.kind == "retry"]
    assert len(retries) == 1
    assert retries[0].attempt == 1 and retries[0].error_type == OverloadedError.__name__
    failed = [e for e in collected if e.kind == "model_call_finished" and not e.ok]
    assert len(failed) == 1 and failed[0].error


async def test_a_failing_run_ends_the_stream_with_its_error(tmp_path: Path) -> None:
    def refuse(request: ModelRequest) -> object:
        raise ModelAPIError("bad request", status_code=400, error_type="invalid_request_error")

    async with Runtime(db=tmp_path / "e.db", model=FunctionModel(refuse)) as rt:
        collected: list[Any] = []
        with anyio.fail_after(30):
            async with rt.stream(Agent(name="solo", model="m"), "go") as events:
                async for event in events:
                    collected.append(event)
        assert events.result is not None  # the failure rule of run: a failed result
        failed_with(events.result, ModelAPIError, match="bad request")
    assert collected[-1].kind == "session_finished" and collected[-1].status == "failed"
    run_finished = [e for e in collected if e.kind == "run_finished"]
    assert run_finished and run_finished[0].status == "stopped"


async def test_stream_rejects_bad_arguments(tmp_path: Path) -> None:
    from anabranch.errors import UserError

    async with Runtime(db=tmp_path / "b.db", model=TestModel()) as rt:
        with pytest.raises(UserError):
            rt.stream(Agent(name="a", model="m"), "x", session_id="ses_1", message="y")
        with pytest.raises(UserError):
            rt.stream()
        with anyio.fail_after(10), pytest.raises(UserError):
            async with rt.stream(Agent(name="a", model="m"), "  ") as events:
                async for _ in events:
                    pass


def test_subscription_merges_only_behind_its_own_run() -> None:
    sub = Subscription(session_id="s", max_deltas=2)

    def delta(run: str, text: str) -> TextDelta:
        return TextDelta(session_id="s", run_id=run, time=0.0, text=text)

    sub.put(delta("a", "1"))
    sub.put(delta("a", "2"))  # merged into the tail
    sub.put(delta("b", "x"))
    sub.put(delta("a", "3"))  # two deltas waiting: merged into a's, behind b's
    assert [(e.run_id, e.text) for e in sub._items] == [("a", "123"), ("b", "x")]  # type: ignore[attr-defined]
    sub.put(Event(kind="run_finished", session_id="s", run_id="a", time=0.0))
    sub.put(delta("a", "4"))  # a lifecycle event of run a came after: not merged past it
    assert len(sub) == 4
    sub.put(delta("other-session", "z").model_copy(update={"session_id": "t"}))
    assert len(sub) == 4


async def test_thinking_arrives_as_thinking_deltas(tmp_path: Path) -> None:
    import json

    from anabranch import ModelSettings

    agent = Agent(
        name="thinker",
        model="claude-sonnet-5-5",
        max_tokens=8_000,
        model_settings=ModelSettings(thinking_budget=2_048),
    )
    async with MessagesServer(policy=TestModel(rounds=0)) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        try:
            async with Runtime(db=tmp_path / "k.db", model=model) as rt:
                with anyio.fail_after(30):
                    async with rt.stream(agent, "why do tides turn?") as events:
                        collected = [e async for e in events]
                assert events.result is not None
                records = await rt.store.load_messages(events.result.run_id)
        finally:
            await model.aclose()
    (answer,) = [json.loads(r.content) for r in records if r.role == "assistant"]
    thought = "".join(b["thinking"] for b in answer if b["type"] == "thinking")
    assert thought, "the model did not think"
    deltas = [e for e in collected if e.kind == "thinking_delta"]
    assert "".join(d.text for d in deltas) == thought
    text = [e for e in collected if e.kind == "text_delta"]
    assert "".join(d.text for d in text) == "".join(
        b["text"] for b in answer if b["type"] == "text"
    )
