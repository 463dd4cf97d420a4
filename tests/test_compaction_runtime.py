"""Per-agent auto-compaction through the real runtime and store (both anyio backends)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from anabranch import Agent, Runtime, ToolContext, tool
from anabranch.agents import ContextPolicy
from anabranch.context._compaction import CompactionEvent, is_compaction_message
from anabranch.context._tokens import estimate_request
from anabranch.errors import (
    CompactionFailedError,
    ModelAPIError,
    ModelConnectionError,
    OverloadedError,
    PromptTooLongError,
)
from anabranch.messages import (
    Message,
    ModelRequest,
    TextBlock,
    ToolDefinition,
    ToolUseBlock,
)
from anabranch.runtime._breaker import COOL_DOWN
from anabranch.runtime._builtins import BuiltinTool, ToolOutcome
from anabranch.runtime._loop import AgentRun
from anabranch.runtime._runtime import default_builtins
from anabranch.runtime._view import RunView
from anabranch.testing import FunctionModel
from anabranch.testing._models import is_summary_request

from .compaction_helpers import FAST_RETRY, Checked, extra, fetch, huge, small_agent
from .helpers import attributes, failed_with, sql

pytestmark = pytest.mark.anyio


async def _boundaries(rt: Runtime, session_id: str) -> list[Any]:
    return await rt.store.list_boundaries(session_id=session_id)


async def _root(rt: Runtime, session_id: str) -> Any:
    runs = await rt.store.list_runs(session_id)
    return next(r for r in runs if r.parent_run_id is None)


# ------------------------------------------------------------------ the main path
async def test_a_long_run_compacts_several_times_and_every_request_is_valid(
    tmp_path: Path,
) -> None:
    agent = small_agent()
    checked = Checked(rounds=16)
    async with Runtime(db=tmp_path / "r.db", model=checked.model, retry=FAST_RETRY) as rt:
        result = await rt.run(agent, "Research SQLite")
        boundaries = await _boundaries(rt, result.session_id)
        snapshots = await sql(
            rt.store,
            "SELECT reason FROM snapshots WHERE run_id = ? ORDER BY version",
            (result.run_id,),
        )
    assert result.status == "done" and "Report on: Research SQLite" in result.output
    assert checked.problems == []
    compactions = [b for b in boundaries if b.kind == "compaction" and b.status == "ok"]
    assert len(compactions) >= 3
    for b in compactions:
        assert b.strategy == "summarize" and b.trigger == "auto"
        assert b.tokens_after < b.tokens_before and b.messages_after < b.messages_before
        assert b.summary and "User asked: Research SQLite" in b.summary
        assert b.model == "test-model" and b.duration is not None
    window = agent.context.window
    for request in checked.main_requests():
        assert estimate_request(request) <= window
    # the prompt did not change, so no compaction stored a new snapshot (the cache survives)
    assert [s["reason"] for s in snapshots] == ["start"]
    # the summarizer is a fork of the run: same system blocks and tools, same model
    main = checked.main_requests()[-1]
    for request in checked.summary_requests():
        assert request.system == main.system and request.tools == main.tools
        assert request.model == "test-model"
    # after the first compaction every main request opens with a marked summary
    compacted = [r for r in checked.main_requests() if is_compaction_message(r.messages[0])]
    assert compacted and compacted[-1] is checked.main_requests()[-1]
    assert compacted[-1].messages[1].role == "assistant"


async def test_a_compaction_rebuilds_the_prompt_snapshot(tmp_path: Path) -> None:
    """Bootstrap files are read again after a compaction (and only then)."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "MEMORY.md").write_text("memory: version one")

    @tool
    def remember(topic: str, ctx: ToolContext) -> str:
        """Update the memory file."""
        (workspace / "MEMORY.md").write_text(f"memory: updated by {ctx.call_id}")
        return "lorem ipsum dolor sit amet " * 25

    agent = small_agent().model_copy(update={"tools": (remember,), "workspace": workspace})
    checked = Checked(rounds=10)
    async with Runtime(db=tmp_path / "r.db", model=checked.model) as rt:
        result = await rt.run(agent, "Research SQLite")
        snapshots = await sql(
            rt.store,
            "SELECT reason, system FROM snapshots WHERE run_id = ? ORDER BY version",
            (result.run_id,),
        )
        boundaries = await _boundaries(rt, result.session_id)
    assert boundaries and snapshots[0]["reason"] == "start"
    assert "version one" in snapshots[0]["system"]
    rebuilt = snapshots[1:]
    assert rebuilt and all(s["reason"] == "compaction" for s in rebuilt)
    assert "memory: updated by" in rebuilt[0]["system"]
    first_compacted = next(
        r for r in checked.main_requests() if is_compaction_message(r.messages[0])
    )
    assert "memory: updated by" in first_compacted.system[-1].text


async def test_resume_rebuilds_the_compacted_context_exactly(tmp_path: Path) -> None:
    agent = small_agent()
    checked = Checked(rounds=10)
    async with Runtime(db=tmp_path / "r.db", model=checked.model) as rt:
        result = await rt.run(agent, "Research SQLite")
        root = await _root(rt, result.session_id)
        run = await AgentRun.load(rt.environment(result.session_id), agent, root)
    last = checked.main_requests()[-1]
    assert run.context[:-1] == list(last.messages)
    assert run.context[-1].text == result.output
    assert run.compactions >= 1


async def test_a_run_interrupted_after_compaction_resumes_and_keeps_compacting(
    tmp_path: Path,
) -> None:
    agent = small_agent()
    db = tmp_path / "r.db"
    first = Checked(rounds=14)
    calls = {"main": 0}

    def flaky(request: ModelRequest) -> Any:
        if not is_summary_request(request):
            calls["main"] += 1
            if calls["main"] == 9:
                raise ModelAPIError("bad request", status_code=400)
        return first.model.function(request)

    async with Runtime(db=db, model=FunctionModel(flaky), retry=FAST_RETRY) as rt:
        failed_with(await rt.run(agent, "Research SQLite"), ModelAPIError)
        session_id = (await rt.store.list_sessions())[0].id
        before = [b for b in await _boundaries(rt, session_id) if b.kind == "compaction"]
    assert before, "the run should have compacted before it was interrupted"
    second = Checked(rounds=14)
    async with Runtime(db=db, model=second.model, agents=[agent]) as rt:
        result = await rt.resume(session_id)
        after = [b for b in await _boundaries(rt, session_id) if b.kind == "compaction"]
    assert result.status == "done"
    assert first.problems == [] and second.problems == []
    assert len(after) > len(before)
    resumed = second.main_requests()[0]
    assert is_compaction_message(resumed.messages[0])


# ------------------------------------------------------------------ budgets and clearing
async def test_oversized_results_are_spilled_with_a_preview_and_a_handle(tmp_path: Path) -> None:
    agent = Agent(
        name="reader",
        model="test-model",
        tools=[huge],
        context=ContextPolicy(tool_result_max_chars=1000, tool_result_preview_chars=300),
    )
    checked = Checked(rounds=1)
    async with Runtime(db=tmp_path / "r.db", model=checked.model) as rt:
        result = await rt.run(agent, "Read it")
        spills = await sql(rt.store, "SELECT handle, call_id FROM spills")
        for spill in spills:  # the output is kept once: the spill may refer to its event
            spill["content"] = await rt.store.get_spill(spill["handle"])
    final = checked.main_requests()[-1]
    inline = final.messages[-1].tool_results[0].content
    assert len(spills) == 1
    handle, call_id, content = spills[0]["handle"], spills[0]["call_id"], spills[0]["content"]
    assert content.startswith("BEGIN") and content.endswith("END") and len(content) > 10_000
    assert inline.startswith("BEGIN") and "END" not in inline
    assert f"recall id={handle}" in inline and len(inline) < 1000
    assert result.status == "done"
    assert call_id == final.messages[-2].tool_uses[0].id


async def test_error_results_keep_head_and_tail(tmp_path: Path) -> None:
    @tool
    async def failing(topic: str) -> str:
        """Fails with a long message."""
        raise RuntimeError("start " + "x" * 3000 + " the real cause")

    agent = Agent(
        name="reader",
        model="test-model",
        tools=[failing],
        context=ContextPolicy(tool_result_max_chars=500, tool_result_preview_chars=200),
    )
    checked = Checked(rounds=1)
    async with Runtime(db=tmp_path / "r.db", model=checked.model) as rt:
        await rt.run(agent, "Try it")
    result = checked.main_requests()[-1].messages[-1].tool_results[0]
    assert result.is_error
    assert "Tool 'failing' failed" in result.content and result.content.endswith("real cause")
    assert "recall id=out_" in result.content


async def test_old_tool_results_are_cleared_above_the_soft_threshold(tmp_path: Path) -> None:
    agent = small_agent(
        window=4000, compact_at=0.95, clear_at=0.3, clear_tool_results_after=2, keep_recent=4
    )
    checked = Checked(rounds=8)
    async with Runtime(db=tmp_path / "r.db", model=checked.model) as rt:
        result = await rt.run(agent, "Research SQLite")
        boundaries = await _boundaries(rt, result.session_id)
        spills = await sql(rt.store, "SELECT handle FROM spills")
    clears = [b for b in boundaries if b.kind == "clear"]
    assert clears and all(b.strategy == "clear" and b.trigger == "soft" for b in clears)
    assert not [b for b in boundaries if b.kind == "compaction"]
    assert checked.problems == []
    final = checked.main_requests()[-1]
    results = [r for m in final.messages for r in m.tool_results]
    stubs = [r for r in results if r.content.startswith("[tool result cleared")]
    assert stubs and results[-1] not in stubs and results[-2] not in stubs
    handles = {s["handle"] for s in spills}
    for stub in stubs:
        assert stub.content.rsplit("recall id=", 1)[1].rstrip("]") in handles
    assert all(b.messages_before == b.messages_after for b in clears)


@pytest.mark.parametrize("strategy", ["verbatim", "window"])
async def test_strategies_without_a_model_call(tmp_path: Path, strategy: str) -> None:
    agent = small_agent(strategy=strategy, window=2500)
    checked = Checked(rounds=14)
    async with Runtime(db=tmp_path / "r.db", model=checked.model) as rt:
        result = await rt.run(agent, "Research SQLite carefully")
        boundaries = await _boundaries(rt, result.session_id)
    compactions = [b for b in boundaries if b.kind == "compaction" and b.status == "ok"]
    assert len(compactions) >= 2 and all(b.strategy == strategy for b in compactions)
    assert checked.summary_requests() == [] and checked.problems == []
    final = checked.main_requests()[-1]
    opening = final.messages[0]
    assert is_compaction_message(opening) and f'strategy="{strategy}"' in opening.text
    assert "Research SQLite carefully" in opening.text
    if strategy == "verbatim":
        elided = [m for m in final.messages if "[tool call fetch id=" in m.text]
        assert elided, "verbatim keeps the old turns, with their tool payloads elided"
    assert result.status == "done"


# ------------------------------------------------------------------ reactive
async def test_prompt_too_long_is_recovered_by_reactive_compaction(tmp_path: Path) -> None:
    agent = small_agent(window=50_000)  # never compacts on its own
    checked = Checked(rounds=10, limit=1200)
    async with Runtime(db=tmp_path / "r.db", model=checked.model, retry=FAST_RETRY) as rt:
        result = await rt.run(agent, "Research SQLite")
        boundaries = await _boundaries(rt, result.session_id)
        calls = await rt.store.list_calls(result.run_id)
    assert result.status == "done"
    reactive = [b for b in boundaries if b.trigger == "reactive"]
    assert reactive and all(b.status == "ok" for b in reactive)
    errors = [c for c in calls if c.status == "error"]
    assert errors and all(c.error_type == "PromptTooLongError" for c in errors)
    for error in errors:  # the same turn was sent again and answered
        assert any(c.turn == error.turn and c.status == "ok" for c in calls)
    assert checked.problems == []


async def test_reactive_compaction_keeps_fewer_messages_each_attempt(tmp_path: Path) -> None:
    """An API that names no maximum: every retry cuts deeper until the request is taken."""
    agent = small_agent(window=50_000, keep_recent=8)
    inner = Checked(rounds=10)
    refusals = {"left": 2, "armed": False}

    def refuse_thrice(request: ModelRequest) -> Any:
        if not is_summary_request(request):
            refusals["armed"] = refusals["armed"] or len(request.messages) > 12
            if refusals["armed"] and refusals["left"]:
                refusals["left"] -= 1
                raise PromptTooLongError("prompt is too long")
        return inner.model.function(request)

    model = FunctionModel(refuse_thrice)
    async with Runtime(db=tmp_path / "r.db", model=model) as rt:
        result = await rt.run(agent, "Research SQLite")
        boundaries = await _boundaries(rt, result.session_id)
    reactive = [b for b in boundaries if b.trigger == "reactive"]
    assert result.status == "done" and inner.problems == []
    assert [extra(b)["level"] for b in reactive] == [1, 2]
    kept = [extra(b)["kept"] for b in reactive]
    assert kept[0] <= 4 and kept == sorted(kept, reverse=True)
    # the deepest level keeps nothing verbatim: the summarizer read the whole context,
    # originals and not stubs, and the request that was taken opens with its summary
    assert kept[-1] == 0
    taken = next(
        r
        for r in model.requests
        if not is_summary_request(r) and r.messages[0].text.startswith("<compacted_context")
    )
    assert taken.messages[0].text.count("summary_of_earlier_conversation") == 2
    for request in model.requests:
        if is_summary_request(request):
            assert "[tool result cleared" not in request.messages[-1].text


async def test_unrecoverable_prompt_too_long_leaves_the_run_resumable(tmp_path: Path) -> None:
    agent = small_agent(window=50_000)
    checked = Checked(rounds=10, limit=300)  # below the system prompt and tools alone
    async with Runtime(db=tmp_path / "r.db", model=checked.model, retry=FAST_RETRY) as rt:
        failed_with(await rt.run(agent, "Research SQLite"), PromptTooLongError)
        session_id = (await rt.store.list_sessions())[0].id
        root = await _root(rt, session_id)
        calls = await rt.store.list_calls(root.id)
        boundaries = await _boundaries(rt, session_id)
    assert root.status == "running"  # unfinished: resumable with a larger limit
    # nothing could be cut, so it stopped at once instead of sending the same prompt again
    assert [c.status for c in calls] == ["error"]
    assert [(b.trigger, b.status) for b in boundaries] == [("reactive", "failed")]
    assert "nothing to compact" in (boundaries[0].error or "")


# ------------------------------------------------------------------ failures and the breaker
def _no_summary(request: ModelRequest) -> str:
    return "<analysis>I could not decide.</analysis>"


async def test_a_failing_summarizer_trips_the_breaker_and_fails_the_run(tmp_path: Path) -> None:
    agent = small_agent(on_compaction_failure="fail", max_compaction_failures=3)

    def transport_error(request: ModelRequest) -> str:
        raise ModelConnectionError("connection reset by peer")

    checked = Checked(rounds=16, on_summary=transport_error)
    async with Runtime(db=tmp_path / "r.db", model=checked.model, retry=FAST_RETRY) as rt:
        failed_with(await rt.run(agent, "Research SQLite"), CompactionFailedError, match="breaker")
        session_id = (await rt.store.list_sessions())[0].id
        boundaries = await _boundaries(rt, session_id)
        root = await _root(rt, session_id)
        session = await rt.store.get_session(session_id)
    assert [(b.kind, b.status) for b in boundaries] == [
        ("compaction", "failed"),
        ("compaction", "failed"),
        ("compaction", "failed"),
        ("breaker", "open"),
    ]
    assert all("ModelConnectionError" in (b.error or "") for b in boundaries)
    # transport errors were retried inside each attempt (3 tries), then counted once
    assert len(checked.summary_requests()) == 9
    assert root.status == "failed" and "breaker" in (root.error or "")
    assert session is not None and session.status == "failed"


async def test_breaker_with_continue_goes_on_with_the_window_strategy(tmp_path: Path) -> None:
    agent = small_agent(on_compaction_failure="continue", max_compaction_failures=2)
    checked = Checked(rounds=16, on_summary=_no_summary)
    async with Runtime(db=tmp_path / "r.db", model=checked.model) as rt:
        result = await rt.run(agent, "Research SQLite")
        boundaries = await _boundaries(rt, result.session_id)
    kinds = [(b.kind, b.status, b.strategy) for b in boundaries]
    assert kinds[:3] == [
        ("compaction", "failed", "summarize"),
        ("compaction", "failed", "summarize"),
        ("breaker", "open", None),
    ]
    # open: the window fallback (with a note of what it dropped); after the cool-down the
    # breaker is half-open: the summarizer is tried once, fails, and the breaker reopens
    later = boundaries[3:]
    assert later and all(
        b.strategy == "window" for b in later if b.kind == "compaction" and b.status == "ok"
    )
    fallbacks = 0
    for boundary in later:
        if boundary.kind == "compaction" and boundary.status == "ok":
            assert extra(boundary)["degraded"]
            assert "dropped without a summary" in (boundary.prefix or "")
            fallbacks += 1
        elif boundary.kind == "compaction":
            assert boundary.strategy == "summarize" and fallbacks >= COOL_DOWN
            fallbacks = 0
    retries = sum(1 for b in later if b.kind == "compaction" and b.status == "failed")
    assert len(checked.summary_requests()) == 2 + retries
    assert result.status == "done" and checked.problems == []
    for request in checked.main_requests():
        assert estimate_request(request) <= agent.context.window


async def test_compactions_that_cannot_get_below_the_threshold_trip_the_breaker(
    tmp_path: Path,
) -> None:
    """Thrash protection: verbatim keeps all prose, so with long prose it stops helping."""
    agent = small_agent(strategy="verbatim", max_compaction_failures=2, window=2000)
    turns = {"n": 0}

    def talkative(request: ModelRequest) -> Any:
        turns["n"] += 1
        prose = TextBlock(text=f"Step {turns['n']}: " + "I am thinking out loud. " * 12)
        if turns["n"] > 14:
            return [TextBlock(text="done")]
        return [prose, ToolUseBlock(id=f"toolu_{turns['n']}", name="fetch", input={"topic": "x"})]

    model = FunctionModel(talkative)
    async with Runtime(db=tmp_path / "r.db", model=model) as rt:
        result = await rt.run(agent, "Think a lot")
        boundaries = await _boundaries(rt, result.session_id)
    assert result.status == "done"
    kinds = [b.kind for b in boundaries]
    assert kinds.count("breaker") == 1
    trip = kinds.index("breaker")
    assert [extra(b).get("ineffective") for b in boundaries[trip - 2 : trip]] == [True, True]
    assert all(b.strategy == "verbatim" for b in boundaries[:trip])
    assert not any(extra(b).get("ineffective") for b in boundaries[: trip - 2])
    after = boundaries[trip + 1 :]
    assert after and all(b.strategy == "window" and extra(b)["degraded"] for b in after)
    for request in model.requests:
        assert estimate_request(request) <= agent.context.window


async def test_breaker_state_survives_a_resume(tmp_path: Path) -> None:
    agent = small_agent(on_compaction_failure="fail", max_compaction_failures=3)
    db = tmp_path / "r.db"
    summaries = {"n": 0}
    inner = Checked(rounds=20, on_summary=_no_summary)

    def stop_after_two_failures(request: ModelRequest) -> Any:
        if is_summary_request(request):
            summaries["n"] += 1
        elif summaries["n"] == 2:
            raise ModelAPIError("process about to crash", status_code=400)
        return inner.model.function(request)

    async with Runtime(db=db, model=FunctionModel(stop_after_two_failures)) as rt:
        failed_with(await rt.run(agent, "Research SQLite"), ModelAPIError)
        session_id = (await rt.store.list_sessions())[0].id
    after = Checked(rounds=20, on_summary=_no_summary)
    async with Runtime(db=db, model=after.model, agents=[agent]) as rt:
        failed_with(await rt.resume(session_id), CompactionFailedError)
        boundaries = await _boundaries(rt, session_id)
    assert [b.kind for b in boundaries] == ["compaction"] * 3 + ["breaker"]
    assert len(after.summary_requests()) == 1  # one more failure was enough


async def test_the_fallback_summarizer_model_takes_over(tmp_path: Path) -> None:
    agent = small_agent(summarizer_model="primary", fallback_summarizer_model="cheap")

    def primary_overloaded(request: ModelRequest) -> Any:
        if request.model == "primary":
            raise OverloadedError("Overloaded", status_code=529)
        return checked.inner.respond(request)

    checked = Checked(rounds=10, on_summary=primary_overloaded)
    async with Runtime(db=tmp_path / "r.db", model=checked.model, retry=FAST_RETRY) as rt:
        result = await rt.run(agent, "Research SQLite")
        boundaries = await _boundaries(rt, result.session_id)
    assert boundaries and all(b.status == "ok" and b.model == "cheap" for b in boundaries)
    models = [r.model for r in checked.summary_requests()]
    assert models[:4] == ["primary", "primary", "primary", "cheap"]


# ------------------------------------------------------------------ the pre-compact hook
@pytest.mark.parametrize("asynchronous", [False, True])
async def test_on_compact_sees_the_messages_and_adds_instructions(
    tmp_path: Path, asynchronous: bool
) -> None:
    seen: list[CompactionEvent] = []

    def hook(event: CompactionEvent) -> str:
        seen.append(event)
        return "Always keep the ticket number ABC-123."

    async def async_hook(event: CompactionEvent) -> str:
        return hook(event)

    agent = small_agent(on_compact=async_hook if asynchronous else hook)
    checked = Checked(rounds=10)
    async with Runtime(db=tmp_path / "r.db", model=checked.model) as rt:
        result = await rt.run(agent, "Research SQLite")
    assert seen
    event = seen[0]
    assert event.agent == "worker" and event.run_id == result.run_id
    assert event.trigger == "auto" and event.strategy == "summarize"
    assert event.messages[0].text == "Research SQLite"
    assert event.tokens >= event.threshold == agent.context.threshold
    # a 1,500-token window keeps no verbatim tail: a quarter of its room holds no turn
    assert event.kept == () or event.kept[0].role == "assistant"
    assert event.messages[-1].tool_results  # the last tool results are summarized too
    for request in checked.summary_requests():
        assert request.messages[-1].text.endswith("Always keep the ticket number ABC-123.")


async def test_a_raising_hook_is_a_recorded_failure(tmp_path: Path) -> None:
    def hook(event: CompactionEvent) -> None:
        raise RuntimeError("hook broke")

    agent = small_agent(on_compact=hook, max_compaction_failures=2)
    checked = Checked(rounds=10)
    async with Runtime(db=tmp_path / "r.db", model=checked.model) as rt:
        result = await rt.run(agent, "Research SQLite")
        boundaries = await _boundaries(rt, result.session_id)
    assert boundaries[0].status == "failed" and "hook broke" in (boundaries[0].error or "")
    assert result.status == "done"


# ------------------------------------------------------------------ independent windows
class Delegate:
    """A minimal delegation builtin: runs a child agent in its own context."""

    name = "delegate"

    def __init__(self, child: Agent) -> None:
        self.child = child

    def applies_to(self, agent: Agent) -> bool:
        return agent.name == "boss"

    def definition(self, agent: Agent) -> ToolDefinition:
        schema = {"type": "object", "properties": {"task": {"type": "string"}}}
        return ToolDefinition(name=self.name, description="Delegate.", input_schema=schema)

    async def run(self, view: RunView, call: ToolUseBlock) -> ToolOutcome:
        run = view
        assert isinstance(run, AgentRun)  # a built-in that starts runs is part of the engine
        child = await AgentRun.start(
            run.env,
            self.child,
            str(call.input.get("task", "sub-task")),
            parent_run_id=run.id,
            parent_call_id=call.id,
            depth=1,
            mode="child",
        )
        return ToolOutcome(await child.drive())


async def test_a_sub_agent_compacts_at_its_own_window(tmp_path: Path) -> None:
    child = small_agent("helper", window=1500)
    boss = Agent(
        name="boss",
        model="test-model",
        tools=[fetch],
        context=ContextPolicy(window=3000, output_reserve=200, keep_recent=4),
        max_turns=40,
    )
    checked = Checked(rounds=8)
    builtins: tuple[BuiltinTool, ...] = (*default_builtins(), Delegate(child))
    async with Runtime(db=tmp_path / "r.db", model=checked.model, builtins=builtins) as rt:
        result = await rt.run(boss, "Split the research")
        runs = {r.id: r for r in await rt.store.list_runs(result.session_id)}
        boundaries = await _boundaries(rt, result.session_id)
    by_agent: dict[str, list[Any]] = {}
    for b in boundaries:
        by_agent.setdefault(runs[b.run_id].agent_name, []).append(b)
    assert by_agent.get("helper"), "the small-window child compacts"
    assert by_agent.get("boss"), "the parent compacts too, at its own larger window"
    for b in by_agent["helper"]:
        assert b.tokens_before >= child.context.threshold
    for b in by_agent["boss"]:
        assert b.tokens_before >= boss.context.threshold > child.context.threshold
    assert checked.problems == []


# ------------------------------------------------------------------ tracing
async def test_every_compaction_is_a_span_with_the_summarizer_call_inside(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    checked = Checked(rounds=10)
    async with Runtime(db=tmp_path / "r.db", model=checked.model, tracer_provider=provider) as rt:
        result = await rt.run(small_agent(), "Research SQLite")
        boundaries = await _boundaries(rt, result.session_id)
    spans = exporter.get_finished_spans()
    compact = [s for s in spans if s.name == "compact worker"]
    assert len(compact) == len(boundaries) >= 1
    span = compact[0]
    attrs = attributes(span)
    assert attrs["openinference.span.kind"] == "CHAIN"
    assert attrs["anabranch.compaction.trigger"] == "auto"
    assert attrs["anabranch.compaction.strategy"] == "summarize"
    assert attrs["anabranch.compaction.tokens_before"] == boundaries[0].tokens_before
    assert attrs["anabranch.compaction.messages_after"] == boundaries[0].messages_after
    assert attrs["anabranch.compaction.kept"] == extra(boundaries[0])["kept"]
    assert attrs["anabranch.compaction.removed_messages"] >= 1
    children = [s for s in spans if s.parent and s.parent.span_id == span.context.span_id]
    assert [c.name for c in children] == ["chat test-model"]
    agent_span = next(s for s in spans if s.name == "invoke_agent worker")
    assert span.parent is not None and span.parent.span_id == agent_span.context.span_id
    later_chats = [
        s
        for s in spans
        if s.name == "chat test-model"
        and (s.start_time or 0) > (span.end_time or 0)
        and s not in children
    ]
    assert later_chats and all(
        attributes(s).get("gen_ai.conversation.compacted") for s in later_chats
    )


# ------------------------------------------------------------------ accounting
async def test_context_tokens_use_the_last_usage_plus_an_estimate(tmp_path: Path) -> None:
    agent = small_agent(window=100_000)
    checked = Checked(rounds=2)
    async with Runtime(db=tmp_path / "r.db", model=checked.model) as rt:
        result = await rt.run(agent, "Research SQLite")
        root = await _root(rt, result.session_id)
        run = await AgentRun.load(rt.environment(result.session_id), agent, root)
    assert run.threshold == agent.context.threshold
    # After load: anchored on the last committed response, as the live run was (resume).
    assert run.last_usage is not None and run.appended_since_usage == []
    usage = run.last_usage
    assert run.context_tokens == usage.total_input_tokens + usage.output_tokens
    from anabranch.messages import Usage

    run.last_usage = Usage(input_tokens=100, cache_read_input_tokens=50, output_tokens=7)
    run.appended_since_usage = [Message.user("x" * 400)]
    assert run.context_tokens == 157 + 115  # usage + (400 chars / 4 * 1.1 + 1 + 4)
