"""What the hot path's leaner plumbing must keep: span status on the way out, the current
span while the block runs, tool lookups that follow a copied definition."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from anabranch import Agent, ContextPolicy, tool
from anabranch.messages import (
    Message,
    SystemBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from anabranch.runtime._run_prompt import build_prompt, run_request, with_breakpoints
from anabranch.store import RunRecord
from anabranch.traces import Tracing


@tool
async def alpha(text: str) -> str:
    """First tool."""
    return text


@tool
async def beta(text: str) -> str:
    """Second tool."""
    return text


def _tracing() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider), exporter


def test_an_exception_is_recorded_with_error_status_and_the_span_is_current() -> None:
    tracing, exporter = _tracing()
    with pytest.raises(ValueError, match="boom"):
        with tracing.tool_call(tool="t", call_id="c1", session_id="s") as span:
            assert trace.get_current_span() is span
            raise ValueError("boom")
    assert trace.get_current_span() is trace.INVALID_SPAN  # detached on the way out
    (finished,) = exporter.get_finished_spans()
    assert finished.status.status_code is StatusCode.ERROR
    assert finished.status.description == "ValueError: boom"
    assert [e.name for e in finished.events] == ["exception"]
    assert finished.end_time is not None


@pytest.mark.anyio
async def test_a_cancellation_ends_the_span_without_an_error() -> None:
    tracing, exporter = _tracing()
    with anyio.CancelScope() as scope:
        with tracing.model_call(model="m", session_id="s", agent="a", attempt=1, compacted=False):
            scope.cancel()
            await anyio.sleep(1)
    assert scope.cancelled_caught
    (finished,) = exporter.get_finished_spans()
    assert finished.status.status_code is StatusCode.UNSET
    assert not finished.events
    assert finished.end_time is not None


def test_a_span_that_cannot_start_leaves_the_block_running() -> None:
    class Broken(TracerProvider):
        def get_tracer(self, *args: object, **kwargs: object) -> trace.Tracer:
            tracer = super().get_tracer("anabranch")

            def fail(*args: object, **kwargs: object) -> trace.Span:
                raise RuntimeError("sdk down")

            tracer.start_span = fail  # type: ignore[method-assign]
            return tracer

    tracing = Tracing(Broken(shutdown_on_exit=False))
    ran = False
    with tracing.tool_call(tool="t", call_id="c1", session_id="s") as span:
        ran = True
        assert span is trace.INVALID_SPAN
    assert ran


def test_tool_lookup_follows_a_copied_definition() -> None:
    agent = Agent(name="a", tools=[alpha])
    assert agent.tool("alpha") is agent.tools[0]
    assert agent.tool("beta") is None
    copied = agent.model_copy(update={"tools": (beta,)})  # carries the first index along
    assert copied.tool("alpha") is None
    assert copied.tool("beta") is copied.tools[0]
    assert agent.tool("alpha") is agent.tools[0]
    assert copied == Agent(name="a", tools=[beta])  # the index is not part of equality


def test_whether_an_agent_asks_approval_follows_a_copied_definition() -> None:
    from anabranch.agents import Tool

    gated: Tool = tool(needs_approval=True)(beta.function)
    agent = Agent(name="a", tools=[alpha])
    assert not agent.asks_approval()
    copied = agent.model_copy(update={"tools": (alpha, gated)})  # carries the first index
    assert copied.asks_approval() and copied.tool("beta") is gated
    assert not agent.asks_approval()


@pytest.mark.parametrize(
    "policy",
    [
        ContextPolicy(),
        ContextPolicy(cache_breakpoints=False),
        ContextPolicy(cache_ttl="1h", prefix_cache_ttl="5m"),
        ContextPolicy(cache_ttl="1h"),
    ],
)
def test_the_request_built_with_its_marks_is_the_placed_request(policy: ContextPolicy) -> None:
    agent = Agent(name="a", tools=[alpha, beta], instructions="Work.", context=policy)
    system = (SystemBlock(text="static part"), SystemBlock(text="dynamic part"))
    tools = tuple(
        ToolDefinition(name=t.name, description=t.description, input_schema=t.input_schema)
        for t in agent.tools
    )
    for turns in (0, 1, 3, 12):  # 12: a long tool turn puts the last mark out of sight
        context = [Message.user("task")]
        for i in range(turns):
            uses = tuple(
                ToolUseBlock(id=f"t{i}_{j}", name="alpha", input={"text": "x"})
                for j in range(turns)
            )
            context.append(Message(role="assistant", content=uses))
            results = tuple(ToolResultBlock(tool_use_id=u.id, content="r") for u in uses)
            context.append(Message(role="user", content=results))
        two_steps = with_breakpoints(
            agent, run_request(agent, system, tools, context, last_response_id="msg_1")
        )
        one = run_request(agent, system, tools, context, last_response_id="msg_1", placed=True)
        assert one == two_steps
        assert one.model_dump_json() == two_steps.model_dump_json()
        assert one.fingerprint() == two_steps.fingerprint()
        assert with_breakpoints(agent, one) is one  # placed already: nothing to copy


def test_runs_of_one_agent_share_their_prompt_blocks() -> None:
    def record(run_id: str) -> RunRecord:
        return RunRecord(id=run_id, session_id="s", agent_name="a", model="m", created=0.0)

    agent = Agent(name="a", tools=[alpha, beta], instructions="Work.")
    first = build_prompt(agent, record("run_1"), ())
    second = build_prompt(agent, record("run_2"), ())
    assert first[0] is second[0] and first[1] is second[1]  # one copy for every run
    other = build_prompt(agent.model_copy(update={"instructions": "Rest."}), record("r3"), ())
    assert other[0] != first[0] and other[1] == first[1]
    assert [t.name for t in other[1]] == ["alpha", "beta"] and other[1][-1].cache == "5m"


def test_a_run_of_the_same_agent_gets_its_prompt_without_building_it_until_an_input_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from anabranch.runtime import _run_prompt
    from anabranch.runtime._definitions import default_builtins

    builds: list[str] = []
    build = _run_prompt._build

    def counted(agent: Agent, *rest: Any) -> Any:
        builds.append(agent.name)
        return build(agent, *rest)

    monkeypatch.setattr(_run_prompt, "_build", counted)

    def record(run_id: str, parent: str | None = None) -> RunRecord:
        return RunRecord(
            id=run_id, session_id="s", agent_name="a", model="m", created=0.0, parent_run_id=parent
        )

    (tmp_path / "AGENTS.md").write_text("Be brief.")
    agent = Agent(name="a", tools=[alpha], workspace=tmp_path, max_report_tokens=500)
    builtins = default_builtins()
    first = build_prompt(agent, record("run_1"), builtins)
    assert build_prompt(agent, record("run_2"), builtins) is first
    assert len(builds) == 1  # built once for both runs
    child = build_prompt(agent, record("run_3", parent="run_1"), builtins)  # a report cap
    assert child[0] != first[0] and len(builds) == 2
    (tmp_path / "AGENTS.md").write_text("Be thorough.")  # an input changed: built again
    changed = build_prompt(agent, record("run_4"), builtins)
    assert len(builds) == 3 and "Be thorough." in "".join(b.text for b in changed[0])

    class Dynamic:  # a built-in of the caller's: its definition may change between runs
        name = "dynamic"
        description = "v1"

        def applies_to(self, agent: Agent) -> bool:
            return True

        def definition(self, agent: Agent) -> ToolDefinition:
            return ToolDefinition(
                name="dynamic", description=self.description, input_schema={"type": "object"}
            )

    dynamic = Dynamic()
    mine = (*builtins, dynamic)
    build_prompt(agent, record("run_5"), mine)  # type: ignore[arg-type]
    dynamic.description = "v2"
    later = build_prompt(agent, record("run_6"), mine)  # type: ignore[arg-type]
    assert [t.description for t in later[1] if t.name == "dynamic"] == ["v2"]


def test_the_children_of_one_role_run_as_one_agent_object_and_share_their_prompt() -> None:
    from anabranch.runtime._definitions import default_builtins
    from anabranch.runtime._memory import inherit_memory
    from anabranch.runtime._spawn import _child_agent

    role = Agent(name="worker", tools=[alpha])
    parent = Agent(name="lead", subagents=[role])
    first, second = _child_agent(parent, role, 300), _child_agent(parent, role, 300)
    assert first is second  # the same frozen object for every child of the role
    assert first == inherit_memory(parent, role).model_copy(update={"max_report_tokens": 300})
    other = _child_agent(parent, role, 200)  # a turn spawning more shares the cap out
    assert other is not first and other.max_report_tokens == 200

    def child(run_id: str) -> RunRecord:
        return RunRecord(
            id=run_id,
            session_id="s",
            agent_name="worker",
            model="m",
            created=0.0,
            parent_run_id="r",
        )

    builtins = default_builtins()
    assert build_prompt(first, child("c1"), builtins) is build_prompt(second, child("c2"), builtins)


def test_a_run_reads_its_policy_threshold_again_only_for_another_policy() -> None:
    from anabranch.runtime._run_context import RunContext

    run = RunContext()
    run.agent = Agent(name="a", context=ContextPolicy(window=100_000))
    assert run.threshold == run.agent.context.threshold
    # another policy (a switched or copied agent): its own threshold, not the kept one
    run.agent = run.agent.model_copy(update={"context": ContextPolicy(window=20_000)})
    assert (
        run.threshold == ContextPolicy(window=20_000).threshold != Agent(name="a").context.threshold
    )


@pytest.mark.anyio
async def test_after_response_gives_something_to_await_only_for_a_check_or_a_hook() -> None:
    from types import SimpleNamespace

    from anabranch.messages import ModelResponse
    from anabranch.runtime._cache_watch import CacheWatch
    from anabranch.runtime._loop import AgentRun
    from anabranch.store import CallRecord

    run = AgentRun.__new__(AgentRun)  # only what ``after_response`` reads
    run.agent = Agent(name="a")
    run.cache_watch = CacheWatch()
    run.env = SimpleNamespace(extras={})  # type: ignore[assignment]
    response = ModelResponse(content=(), usage=Usage(cache_read_input_tokens=10))

    def call(turn: int) -> CallRecord:
        return CallRecord(
            run_id="r", turn=turn, attempt=1, fingerprint="f", message_count=1, created=0.0
        )

    # a first call, and one that read all the cache the previous call left: no coroutine
    assert run.after_response(1, call(1), response) is None
    assert run.after_response(2, call(2), response) is None
    seen: list[tuple[object, int, ModelResponse]] = []

    async def hook(hooked: object, call_id: int, answered: ModelResponse) -> None:
        seen.append((hooked, call_id, answered))

    run.env.extras["after_response"] = hook
    after = run.after_response(3, call(3), response)
    assert after is not None and not seen  # the hook runs when awaited, at once
    await after
    assert seen == [(run, 3, response)]
