"""spawn_agent: parallel children with isolated contexts, capped reports, limits, forks."""

from __future__ import annotations

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from anabranch import Agent, ContextPolicy, Runtime, SpawnLimits, tool
from anabranch.context._pairing import pairing_violations
from anabranch.errors import ModelAPIError
from anabranch.messages import ModelRequest, TextBlock
from anabranch.runtime._context_view import ContextView
from anabranch.runtime._pipeline import PassThroughPipeline
from anabranch.runtime._spawn import fork_definition
from anabranch.testing import TestModel

from .helpers import sql
from .subagent_helpers import (
    assert_store_consistent,
    eventually,
    first_turn,
    overlaps,
    requests_for,
    results_of,
    routed,
    run_messages,
    runs_by_agent,
    spawn,
    text_of,
    use,
)

pytestmark = pytest.mark.anyio

SMALL = ContextPolicy(window=8_000, output_reserve=500)


def _agents_with(*subagents: Agent, **kwargs: object) -> Agent:
    return Agent(name="boss", model="boss", subagents=subagents, context=SMALL, **kwargs)


async def test_spawn_agent_is_offered_with_an_enum_of_subagents(tmp_path: object) -> None:
    a = Agent(name="alpha", model="m", description="does alpha")
    b = Agent(name="beta", model="m")
    boss = Agent(name="boss", model="m", subagents=[a, b])
    model = TestModel()
    async with Runtime(db=tmp_path / "s.db", model=model) as rt:  # type: ignore[operator]
        await rt.run(boss, "go")
    boss_tools = {t.name: t for t in model.requests[0].tools}
    schema = boss_tools["spawn_agent"].input_schema
    assert schema["properties"]["agent"]["enum"] == ["alpha", "beta"]
    assert schema["properties"]["task"]["type"] == "string"
    assert schema["properties"]["mode"]["enum"] == ["fresh", "fork"]
    assert schema["properties"]["mode"]["default"] == "fresh"
    assert schema["required"] == ["agent", "task"]
    child_requests = [r for r in model.requests if "spawn_agent" not in {t.name for t in r.tools}]
    assert child_requests, "children (no subagents) are not offered spawn_agent"


async def test_parallel_children_overlap_in_time(tmp_path: object) -> None:
    a_started, b_started = anyio.Event(), anyio.Event()

    @tool(timeout=10)
    async def wait_for_b() -> str:
        """Signal and wait for the other child."""
        a_started.set()
        await b_started.wait()
        return "a met b"

    @tool(timeout=10)
    async def wait_for_a() -> str:
        """Signal and wait for the other child."""
        b_started.set()
        await a_started.wait()
        return "b met a"

    a = Agent(name="a", model="m", tools=[wait_for_b])
    b = Agent(name="b", model="m", tools=[wait_for_a])
    boss = Agent(name="boss", model="m", subagents=[a, b])
    async with Runtime(db=tmp_path / "p.db", model=TestModel()) as rt:  # type: ignore[operator]
        result = await rt.run(boss, "meet")
        runs = await runs_by_agent(rt.store, result.session_id)
        root = runs["boss"][0]
        boss_messages = await run_messages(rt.store, root.id)
        await assert_store_consistent(rt.store, result.session_id)
    spawn_results = [r for m in boss_messages for r in m.tool_results]
    assert len(spawn_results) == 2 and not any(r.is_error for r in spawn_results)
    assert "a met b" in spawn_results[0].content + spawn_results[1].content
    child_a, child_b = runs["a"][0], runs["b"][0]
    assert child_a.status == child_b.status == "done"
    assert overlaps(child_a, child_b)
    for child in (child_a, child_b):
        assert child.parent_run_id == root.id and child.depth == 1 and child.mode == "fresh"
    spawn_ids = {u.id for m in boss_messages for u in m.tool_uses}
    assert {child_a.parent_call_id, child_b.parent_call_id} == spawn_ids


async def test_child_transcript_never_reaches_the_parent(tmp_path: object) -> None:
    @tool
    def dig() -> str:
        """Dig up raw material."""
        return "SECRET-TRANSCRIPT-PAYLOAD " * 20

    def boss(request: ModelRequest) -> object:
        if first_turn(request):
            return [spawn("digger", "dig for facts")]
        return "done: " + results_of(request)[0].content

    def digger(request: ModelRequest) -> object:
        if first_turn(request):
            return [use("dig", "toolu_dig")]
        return "REPORT: two facts found"

    digger_agent = Agent(name="digger", model="digger", tools=[dig])
    model = routed(boss=boss, digger=digger)
    async with Runtime(db=tmp_path / "i.db", model=model) as rt:  # type: ignore[operator]
        result = await rt.run(_agents_with(digger_agent), "PARENT-ONLY-TASK")
        runs = await runs_by_agent(rt.store, result.session_id)
        parent_messages = await run_messages(rt.store, runs["boss"][0].id)
    child_id = runs["digger"][0].id
    for request in requests_for(model, "boss"):
        assert "SECRET-TRANSCRIPT" not in text_of(request)
    assert not any("SECRET-TRANSCRIPT" in str(m.model_dump()) for m in parent_messages)
    report = results_of(requests_for(model, "boss")[-1])[0].content
    assert "REPORT: two facts found" in report and child_id in report
    child_first = requests_for(model, "digger")[0]
    assert [m.text for m in child_first.messages] == ["dig for facts"]
    assert "PARENT-ONLY-TASK" not in text_of(child_first)
    assert "Keep it under" in child_first.system[0].text  # the child is told its report cap


async def test_long_report_is_capped_with_a_recall_handle(tmp_path: object) -> None:
    long_report = " ".join(f"finding-{i}" for i in range(400))

    def boss(request: ModelRequest) -> object:
        return [spawn("writer", "write a lot")] if first_turn(request) else "ok"

    writer = Agent(name="writer", model="writer", max_report_tokens=25)
    model = routed(boss=boss, writer=lambda request: long_report)
    async with Runtime(db=tmp_path / "c.db", model=model) as rt:  # type: ignore[operator]
        result = await rt.run(_agents_with(writer), "go")
        child = (await runs_by_agent(rt.store, result.session_id))["writer"][0]
        handle = f"report_{child.id}"
        spilled = await rt.store.get_spill(handle)
    content = results_of(requests_for(model, "boss")[-1])[0].content
    header, body = content.split("\n", 1)
    assert child.id in header
    report_part, marker = body.rsplit("\n", 1)
    assert len(report_part) <= 25 * 4
    assert long_report.startswith(report_part)
    assert marker.startswith("[report cut to") and f"recall id={handle}" in marker
    assert spilled == long_report
    assert child.output == long_report  # the store keeps the whole report
    assert "under 25 tokens" in requests_for(model, "writer")[0].system[0].text


async def test_reports_of_one_turn_are_bounded_together(tmp_path: object) -> None:
    def boss(request: ModelRequest) -> object:
        if first_turn(request):
            return [spawn("w", f"part {i}", call_id=f"toolu_{i}") for i in range(4)]
        return "ok"

    worker = Agent(name="w", model="w", max_report_tokens=5_000)
    model = routed(boss=boss, w=lambda request: "x " * 10_000)
    limits = SpawnLimits(reports_share=0.25)
    boss_agent = Agent(name="boss", model="boss", subagents=[worker], context=SMALL)
    async with Runtime(db=tmp_path / "b.db", model=model, spawn_limits=limits) as rt:  # type: ignore[operator]
        await rt.run(boss_agent, "go")
    results = results_of(requests_for(model, "boss")[-1])
    assert len(results) == 4 and not any(r.is_error for r in results)
    per_child = SMALL.window * 0.25 / 4  # tokens
    overhead = 200  # header line and cut marker
    assert sum(len(r.content) for r in results) <= 4 * (per_child * 4 + overhead)
    told = f"under {int(per_child)} tokens"
    assert all(told in r.system[0].text for r in requests_for(model, "w"))


async def test_unknown_subagent_is_an_error_naming_the_allowed_ones(tmp_path: object) -> None:
    def boss(request: ModelRequest) -> object:
        return [spawn("ghost", "boo")] if first_turn(request) else "ok"

    model = routed(boss=boss)
    subs = (Agent(name="alpha", model="m"), Agent(name="beta", model="m"))
    async with Runtime(db=tmp_path / "u.db", model=model) as rt:  # type: ignore[operator]
        result = await rt.run(_agents_with(*subs), "go")
        runs = await rt.store.list_runs(result.session_id)
    (outcome,) = results_of(model.requests[-1])
    assert outcome.is_error
    assert "'ghost'" in outcome.content and "alpha, beta" in outcome.content
    assert len(runs) == 1


async def test_depth_limit_refuses_deeper_spawns(tmp_path: object) -> None:
    leaf = Agent(name="leaf", model="m")
    middle = Agent(name="middle", model="m", subagents=[leaf])
    boss = Agent(name="boss", model="m", subagents=[middle])
    limits = SpawnLimits(max_depth=1)
    async with Runtime(db=tmp_path / "d.db", model=TestModel(), spawn_limits=limits) as rt:  # type: ignore[operator]
        result = await rt.run(boss, "go")
        runs = await runs_by_agent(rt.store, result.session_id)
        mid = runs["middle"][0]
        events = await sql(
            rt.store,
            "SELECT content, is_error FROM tool_events WHERE run_id = ? AND event = 'finished'",
            (mid.id,),
        )
    assert "leaf" not in runs
    assert mid.status == "done"
    (event,) = events
    assert event["is_error"] == 1
    assert "maximum sub-agent depth is 1" in event["content"]


async def test_concurrent_children_limit(tmp_path: object) -> None:
    release = anyio.Event()

    @tool(timeout=10)
    async def hold() -> str:
        """Hold until released."""
        await release.wait()
        return "held"

    def boss(request: ModelRequest) -> object:
        if first_turn(request):
            return [spawn("h", f"job {i}", call_id=f"toolu_{i}") for i in range(3)]
        return "ok"

    def holder(request: ModelRequest) -> object:
        return [use("hold", "toolu_hold")] if first_turn(request) else "released"

    h = Agent(name="h", model="h", tools=[hold])
    model = routed(boss=boss, h=holder)
    limits = SpawnLimits(max_children=2)
    async with Runtime(db=tmp_path / "m.db", model=model, spawn_limits=limits) as rt:  # type: ignore[operator]

        async def release_after_refusal() -> None:
            # the refusal is committed as a finished (error) tool event of the parent
            query = "SELECT 1 FROM tool_events WHERE event = 'finished' AND is_error = 1"

            async def refused() -> bool:
                return bool(await sql(rt.store, query))

            await eventually(refused)
            release.set()

        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(release_after_refusal)
                await rt.run(_agents_with(h), "go")
    results = results_of(requests_for(model, "boss")[-1])
    refused = [r for r in results if r.is_error]
    assert len(refused) == 1
    assert "max_children=2" in refused[0].content
    assert sum(1 for r in results if "held" in r.content or "released" in r.content) == 2


async def test_child_timeout_fails_only_that_call(tmp_path: object) -> None:
    @tool(timeout=60)
    async def stall() -> str:
        """Never finishes."""
        await anyio.sleep_forever()
        return "never"

    def boss(request: ModelRequest) -> object:
        if first_turn(request):
            return [spawn("slow", "stall"), spawn("quick", "answer")]
        return "ok"

    slow = Agent(name="slow", model="slow", tools=[stall], timeout=0.3, on_limit="fail")
    quick = Agent(name="quick", model="quick")
    model = routed(
        boss=boss,
        slow=lambda r: [use("stall", "toolu_stall")] if first_turn(r) else "late",
        quick=lambda r: "quick report",
    )
    async with Runtime(db=tmp_path / "t.db", model=model) as rt:  # type: ignore[operator]
        result = await rt.run(_agents_with(slow, quick), "go")
        runs = await runs_by_agent(rt.store, result.session_id)
        await assert_store_consistent(rt.store, result.session_id)
    assert result.status == "done"
    slow_result, quick_result = results_of(requests_for(model, "boss")[-1])
    assert slow_result.is_error and "timed out after 0.3 seconds" in slow_result.content
    assert runs["slow"][0].id in slow_result.content
    assert not quick_result.is_error and "quick report" in quick_result.content
    assert runs["slow"][0].status == "failed"
    assert runs["quick"][0].status == "done"


async def test_child_max_turns_and_model_failure_are_errors(tmp_path: object) -> None:
    def boss(request: ModelRequest) -> object:
        if first_turn(request):
            return [spawn("looper", "loop"), spawn("broken", "fail")]
        return "ok"

    def broken(request: ModelRequest) -> object:
        raise ModelAPIError("invalid request: bad thing", status_code=400)

    @tool
    def again() -> str:
        """Do it again."""
        return "again"

    looper = Agent(name="looper", model="looper", tools=[again], max_turns=2, on_limit="fail")
    model = routed(
        boss=boss, looper=lambda r: [use("again", f"toolu_{len(r.messages)}")], broken=broken
    )
    async with Runtime(db=tmp_path / "x.db", model=model) as rt:  # type: ignore[operator]
        result = await rt.run(_agents_with(looper, Agent(name="broken", model="broken")), "go")
        runs = await runs_by_agent(rt.store, result.session_id)
        await assert_store_consistent(rt.store, result.session_id)
    loop_result, broken_result = results_of(requests_for(model, "boss")[-1])
    assert loop_result.is_error and "max_turns=2" in loop_result.content
    assert broken_result.is_error and "bad thing" in broken_result.content
    assert runs["looper"][0].status == runs["broken"][0].status == "failed"
    assert result.status == "done"


async def test_fork_starts_from_the_parents_exact_context(tmp_path: object) -> None:
    @tool
    def look(topic: str) -> str:
        """Look something up."""
        return f"looked at {topic}"

    fork_marker = "You are now a forked sub-agent"

    def boss(request: ModelRequest) -> object:
        last = request.messages[-1]
        if fork_marker in last.text:
            return "fork report: done"
        if first_turn(request):
            return [
                TextBlock(text="Delegating."),
                use("look", "toolu_look", topic="x"),
                spawn("helper", "check the numbers", mode="fork", call_id="toolu_fork"),
            ]
        return "final"

    helper = Agent(
        name="helper",
        model="other-model",
        instructions="Be a careful checker.",
        context=ContextPolicy(window=50_000),
        max_turns=3,
        max_report_tokens=100,
    )
    boss_agent = Agent(
        name="boss",
        model="boss",
        instructions="You are the boss.",
        tools=[look],
        subagents=[helper],
        context=SMALL,
    )
    model = routed(boss=boss)
    async with Runtime(db=tmp_path / "f.db", model=model) as rt:  # type: ignore[operator]
        result = await rt.run(boss_agent, "start here")
        runs = await runs_by_agent(rt.store, result.session_id)
        root, child = runs["boss"][0], runs["helper"][0]
        root_snapshot = await rt.store.latest_snapshot(root.id)
        child_snapshot = await rt.store.latest_snapshot(child.id)
        await assert_store_consistent(rt.store, result.session_id)
    parent_first = model.requests[0]
    fork_first = next(r for r in model.requests if fork_marker in r.messages[-1].text)
    assert fork_first.model == parent_first.model == "boss"
    assert fork_first.system == parent_first.system
    assert fork_first.tools == parent_first.tools
    n = len(parent_first.messages)
    assert fork_first.messages[:n] == parent_first.messages
    assert fork_first.messages[n].role == "assistant"
    assert {u.id for u in fork_first.messages[n].tool_uses} == {"toolu_look", "toolu_fork"}
    fork_turn = fork_first.messages[n + 1]
    answers = {r.tool_use_id: r.content for r in fork_turn.tool_results}
    assert "check the numbers" in answers["toolu_fork"]
    assert "Not part of your task" in answers["toolu_look"]
    assert "Be a careful checker." in fork_turn.text and "under 100 tokens" in fork_turn.text
    assert pairing_violations(fork_first.messages) == []
    assert root_snapshot is not None and child_snapshot is not None
    assert (child_snapshot.system, child_snapshot.tools) == (
        root_snapshot.system,
        root_snapshot.tools,
    )
    assert child.mode == "fork" and child.model == "boss" and child.depth == 1
    final_results = {r.tool_use_id: r for r in results_of(model.requests[-1])}
    assert "fork report: done" in final_results["toolu_fork"].content
    assert final_results["toolu_look"].content == "looked at x"


def test_fork_definition_keeps_the_parents_prompt_and_the_roles_limits() -> None:
    parent = Agent(name="p", model="big", instructions="parent", context=ContextPolicy(window=9000))
    role = Agent(
        name="r",
        model="small",
        instructions="role",
        context=ContextPolicy(window=3000, output_reserve=100),
        max_turns=4,
        timeout=5.0,
    )
    forked = fork_definition(parent, role, report_tokens=50)
    assert (forked.model, forked.instructions, forked.tools) == ("big", "parent", parent.tools)
    assert forked.name == "r" and forked.context.window == 3000
    assert (forked.max_turns, forked.timeout, forked.max_report_tokens) == (4, 5.0, 50)


class _WindowRecorder(PassThroughPipeline):
    def __init__(self) -> None:
        self.seen: dict[str, tuple[int, int]] = {}

    async def before_call(self, run: ContextView) -> None:
        self.seen[run.agent.name] = (run.agent.context.window, run.threshold)


async def test_each_child_keeps_its_own_window(tmp_path: object) -> None:
    def boss(request: ModelRequest) -> object:
        if first_turn(request):
            return [spawn("small", "s"), spawn("big", "b", mode="fork")]
        return "ok"

    small = Agent(
        name="small",
        model="small",
        context=ContextPolicy(window=4_000, compact_at=0.5, output_reserve=100),
    )
    big = Agent(name="big", model="big", context=ContextPolicy(window=90_000, compact_at=0.8))
    pipeline = _WindowRecorder()
    model = routed(
        boss=lambda r: "fork done" if "forked" in r.messages[-1].text else boss(r),
        small=lambda r: "s",
    )
    async with Runtime(db=tmp_path / "w.db", model=model, pipeline=pipeline) as rt:  # type: ignore[operator]
        await rt.run(_agents_with(small, big), "go")
    assert pipeline.seen["boss"] == (SMALL.window, SMALL.threshold)
    assert pipeline.seen["small"] == (4_000, 2_000)
    assert pipeline.seen["big"] == (90_000, 72_000)  # a fork too has its role's window


async def test_child_spans_nest_under_the_spawn_call(tmp_path: object) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    boss = Agent(name="boss", model="m", subagents=[Agent(name="kid", model="m")])
    async with Runtime(db=tmp_path / "o.db", model=TestModel(), tracer_provider=provider) as rt:  # type: ignore[operator]
        await rt.run(boss, "go")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    spawn_span, kid_span = spans["execute_tool spawn_agent"], spans["invoke_agent kid"]
    assert kid_span.parent is not None and spawn_span.context is not None
    assert kid_span.parent.span_id == spawn_span.context.span_id
    assert kid_span.context is not None and spawn_span.context.trace_id == kid_span.context.trace_id


async def test_a_timed_out_child_ends_its_own_children_too(tmp_path: object) -> None:
    @tool(timeout=60)
    async def stall() -> str:
        """Never finishes."""
        await anyio.sleep_forever()
        return "never"

    leaf = Agent(name="leaf", model="leaf", tools=[stall])
    middle = Agent(name="middle", model="middle", subagents=[leaf], timeout=0.3, on_limit="fail")
    model = routed(
        boss=lambda r: [spawn("middle", "delegate")] if first_turn(r) else "ok",
        middle=lambda r: [spawn("leaf", "stall")] if first_turn(r) else "unreachable",
        leaf=lambda r: [use("stall", "toolu_stall")],
    )
    async with Runtime(db=tmp_path / "tt.db", model=model) as rt:  # type: ignore[operator]
        result = await rt.run(_agents_with(middle), "go")
        runs = await runs_by_agent(rt.store, result.session_id)
        await assert_store_consistent(rt.store, result.session_id)
    mid, low = runs["middle"][0], runs["leaf"][0]
    assert result.status == "done"
    assert (mid.status, mid.error) == ("failed", "timed out after 0.3 seconds")
    assert low.status == "failed"
    assert low.error == f"stopped with run {mid.id}: timed out after 0.3 seconds"
