"""Limits that end well: turn, time and budget limits end a run with a report of what it
found, through the real SDK against the local Messages API server."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from anabranch import Agent, AnthropicModel, Budget, Graph, RetryPolicy, Runtime, Task, tool
from anabranch.errors import BudgetExceeded, ModelAPIError
from anabranch.messages import ModelRequest, TextBlock
from anabranch.testing import FunctionModel, MessagesServer

from .subagent_helpers import (
    assert_store_consistent,
    first_turn,
    results_of,
    routed,
    runs_by_agent,
    spawn,
    use,
)

pytestmark = pytest.mark.anyio

FAST_RETRY = RetryPolicy(max_attempts=2, base_delay=0.0, max_delay=0.0)
FACT = re.compile(r"FACT-[a-z]+-\d+")


@tool
def lookup(topic: str) -> str:
    """Look one thing up; every answer holds one new fact."""
    return f"{topic}: found FACT-{topic}"


@asynccontextmanager
async def served(policy: FunctionModel, db: Path, **runtime: Any) -> AsyncIterator[Runtime]:
    """A runtime whose model is the real SDK talking to the local server."""
    async with MessagesServer(policy) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        try:
            async with Runtime(db=db, model=model, retry=FAST_RETRY, **runtime) as rt:
                rt.server = srv  # type: ignore[attr-defined]
                yield rt
        finally:
            await model.aclose()


def facts_in(text: str) -> set[str]:
    return set(FACT.findall(text))


def researcher_policy(name: str) -> Any:
    """Looks up one new fact per turn and never stops by itself; told to stop (tools
    off), it reports every fact its tool results held."""

    def answer(request: ModelRequest) -> object:
        if request.settings.tool_choice == "none":
            seen = sorted(facts_in(" ".join(r.content for r in results_of(request))))
            return f"Findings of {name}: " + ", ".join(seen)
        turn = sum(1 for m in request.messages if m.role == "assistant")
        return [
            TextBlock(text=f"Looking up item {turn}."),
            use("lookup", f"toolu_{name}_{turn}", topic=f"{name}-{turn}"),
        ]

    return answer


def supervisor(request: ModelRequest) -> object:
    if first_turn(request):
        return [
            spawn("turns", "gather facts", call_id="toolu_s1"),
            spawn("spend", "gather facts", call_id="toolu_s2"),
        ]
    return "Answer from the reports:\n" + "\n".join(r.content for r in results_of(request))


async def test_turn_and_budget_limited_children_report_to_the_supervisor(tmp_path: Path) -> None:
    turns = Agent(name="turns", model="turns", tools=[lookup], max_turns=7)
    spend = Agent(name="spend", model="spend", tools=[lookup], budget=Budget(max_tokens=3_000))
    boss = Agent(name="boss", model="boss", subagents=[turns, spend])
    model = routed(
        boss=supervisor, turns=researcher_policy("turns"), spend=researcher_policy("spend")
    )
    async with served(model, tmp_path / "l.db") as rt:
        result = await rt.run(boss, "research")
        runs = await runs_by_agent(rt.store, result.session_id)
        await assert_store_consistent(rt.store, result.session_id)
        log = rt.server.log  # type: ignore[attr-defined]
    turns_run, spend_run = runs["turns"][0], runs["spend"][0]
    assert (turns_run.status, spend_run.status) == ("incomplete", "incomplete")
    assert turns_run.error and turns_run.error.startswith("max_turns:")
    assert spend_run.error and spend_run.error.startswith("budget:")
    # every fact either child gathered reaches the supervisor's answer
    gathered: set[str] = set()
    for record in log:
        if record.request is not None and record.request.model in ("turns", "spend"):
            gathered |= facts_in(" ".join(r.content for r in results_of(record.request)))
    assert len([f for f in gathered if "turns" in f]) == 7
    assert len([f for f in gathered if "spend" in f]) >= 2
    assert gathered <= facts_in(result.output)
    assert result.status == "done" and not result.incomplete  # the supervisor finished
    reports = results_of(model.requests[-1])
    assert not any(r.is_error for r in reports)
    assert "incomplete report of sub-agent turns" in reports[0].content
    assert "turn limit (max_turns=7)" in reports[0].content
    assert "incomplete report of sub-agent spend" in reports[1].content
    assert "your budget (3,000 tokens)" in reports[1].content
    # each child's last request: tools still listed (cache prefix kept), tool_choice none,
    # and the stop notice in the new user turn
    for name in ("turns", "spend"):
        final = [r.request for r in log if r.request is not None and r.request.model == name][-1]
        assert final.settings.tool_choice == "none" and final.tools
        assert "[limit reached]" in final.messages[-1].text
    assert len(model.requests) == sum(1 for r in log if r.endpoint == "messages")
    spend_usage = await rt_usage(tmp_path / "l.db", result.session_id, spend_run.id)
    assert spend_usage <= 3_000  # the reserve held the final report


async def rt_usage(db: Path, session_id: str, run_id: str) -> int:
    async with Runtime(db=db) as rt:
        usage = await rt.session_usage(session_id, run_id=run_id)
    return usage.total_input_tokens + usage.output_tokens


async def test_a_session_budget_stops_the_whole_tree_with_an_incomplete_result(
    tmp_path: Path,
) -> None:
    kids = [Agent(name=n, model="kid", tools=[lookup]) for n in ("a", "b")]

    def boss(request: ModelRequest) -> object:
        if request.settings.tool_choice == "none":
            reports = " ".join(r.content for r in results_of(request))
            return "Partial answer: " + ", ".join(sorted(facts_in(reports)))
        if first_turn(request):
            return [spawn("a", "dig", call_id="toolu_a"), spawn("b", "dig", call_id="toolu_b")]
        return [use("lookup", f"toolu_boss_{len(request.messages)}", topic="boss")]

    budget = Budget(max_tokens=12_000)
    model = routed(boss=boss, kid=researcher_policy("kid"))
    top = Agent(name="boss", model="boss", tools=[lookup], subagents=kids)
    async with served(model, tmp_path / "s.db") as rt:
        result = await rt.run(top, "research", budget=budget)
        runs = await rt.store.list_runs(result.session_id)
        await assert_store_consistent(rt.store, result.session_id)
        session = await rt.store.get_session(result.session_id)
    total = result.usage.total_input_tokens + result.usage.output_tokens
    assert result.incomplete and result.stop_reason == "budget"
    assert result.status == "done" and result.output.startswith("Partial answer:")
    assert {r.status for r in runs} == {"incomplete"}
    assert session is not None and session.status == "incomplete"
    assert total <= 12_000, total  # the reserve held every final report
    assert facts_in(result.output)  # what the children found reached the answer


async def test_soft_limit_is_told_in_the_next_user_turn_and_marked_on_the_span(
    tmp_path: Path,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    worker = Agent(
        name="worker",
        model="worker",
        tools=[lookup],
        budget=Budget(max_tokens=4_000, soft=0.5),
    )
    model = FunctionModel(researcher_policy("w"))
    async with served(model, tmp_path / "soft.db", tracer_provider=provider) as rt:
        result = await rt.run(worker, "research")
    assert result.incomplete and result.stop_reason == "budget"
    warned = [
        i for i, r in enumerate(model.requests) if "[budget] Your budget is" in r.messages[-1].text
    ]
    assert len(warned) == 1, "told once"
    told = model.requests[warned[0]]
    earlier = model.requests[warned[0] - 1]
    # the notice is in a new user turn: everything the previous request sent is unchanged
    assert told.messages[: len(earlier.messages)] == earlier.messages
    assert "tokens left" in told.messages[-1].text
    spans = {s.name: s for s in exporter.get_finished_spans()}
    agent_span = spans["invoke_agent worker"]
    events = {e.name: e for e in agent_span.events}
    assert "anabranch.limit.soft" in events
    soft = dict(events["anabranch.limit.soft"].attributes or {})
    assert soft["anabranch.limit.scope"] == "agent worker"
    attributes = dict(agent_span.attributes or {})
    assert attributes["anabranch.limit.reason"] == "budget"
    remaining = attributes["anabranch.budget.remaining_tokens"]
    assert isinstance(remaining, int) and 0 <= remaining < 4_000


async def test_a_timed_out_child_reports_what_it_found(tmp_path: Path) -> None:
    stalled = anyio.Event()

    @tool(timeout=60)
    async def stall() -> str:
        """Never finishes."""
        stalled.set()
        await anyio.sleep_forever()
        return "never"

    def slow(request: ModelRequest) -> object:
        if request.settings.tool_choice == "none":
            return "Found so far: " + ", ".join(
                sorted(facts_in(" ".join(r.content for r in results_of(request))))
            )
        if first_turn(request):
            return [TextBlock(text="first a lookup"), use("lookup", "toolu_l", topic="slow-1")]
        return [use("stall", "toolu_stall")]

    child = Agent(name="slow", model="slow", tools=[lookup, stall], timeout=0.5)

    def boss(request: ModelRequest) -> object:
        return [spawn("slow", "go")] if first_turn(request) else results_of(request)[0].content

    model = routed(boss=boss, slow=slow)
    async with served(model, tmp_path / "t.db") as rt:
        with anyio.fail_after(20):
            result = await rt.run(Agent(name="boss", model="boss", subagents=[child]), "go")
        runs = await runs_by_agent(rt.store, result.session_id)
        await assert_store_consistent(rt.store, result.session_id)
    assert stalled.is_set()
    run = runs["slow"][0]
    assert run.status == "incomplete" and (run.error or "").startswith("timeout:")
    assert "FACT-slow-1" in result.output
    assert "time limit (timeout=0.5 seconds)" in result.output
    final = [r for r in model.requests if r.model == "slow"][-1]
    stall_result = next(r for r in results_of(final) if r.tool_use_id == "toolu_stall")
    assert stall_result.is_error and "Not run" in stall_result.content


async def test_a_failed_final_report_returns_the_runtimes_record(tmp_path: Path) -> None:
    def child(request: ModelRequest) -> object:
        if request.settings.tool_choice == "none":
            raise ModelAPIError("invalid_request_error: no report today", status_code=400)
        turn = sum(1 for m in request.messages if m.role == "assistant")
        return [
            TextBlock(text=f"Noted finding NOTE-{turn}."),
            use("lookup", f"toolu_c{turn}", topic=f"c-{turn}"),
        ]

    def boss(request: ModelRequest) -> object:
        return [spawn("kid", "go")] if first_turn(request) else "done"

    kid = Agent(name="kid", model="kid", tools=[lookup], max_turns=3)
    model = routed(boss=boss, kid=child)
    async with served(model, tmp_path / "f.db") as rt:
        result = await rt.run(Agent(name="boss", model="boss", subagents=[kid]), "go")
        runs = await runs_by_agent(rt.store, result.session_id)
    (report,) = results_of(model.requests[-1])
    assert report.is_error and "no report today" in report.content
    assert "What the runtime recorded of its findings" in report.content
    assert all(f"NOTE-{i}" in report.content for i in range(3))
    assert runs["kid"][0].status == "failed"
    assert "NOTE-2" in (runs["kid"][0].output or "")


async def test_no_budget_left_refuses_a_spawn_and_a_new_run(tmp_path: Path) -> None:
    def boss(request: ModelRequest) -> object:
        if request.settings.tool_choice == "none":
            return "could not delegate"
        return [spawn("kid", "go")] if first_turn(request) else "unreachable"

    long_prompt = "Follow the plan carefully. " * 200  # the first call alone uses the budget
    top = Agent(
        name="boss",
        model="boss",
        instructions=long_prompt,
        subagents=[Agent(name="kid", model="kid")],
    )
    model = routed(boss=boss, kid=lambda r: "kid report")
    budgets = {"acme": Budget(max_tokens=1_000, per="day")}
    async with served(model, tmp_path / "r.db", budgets=budgets) as rt:
        result = await rt.run(top, "go", tenant="acme")
        runs = await rt.store.list_runs(result.session_id)
        with pytest.raises(BudgetExceeded, match="the budget of acme is used up"):
            await rt.run(top, "again", tenant="acme")
    (refused,) = results_of([r for r in model.requests if r.model == "boss"][-1])
    assert refused.is_error and "Cannot spawn kid: the budget of acme is used up" in refused.content
    assert [r.agent_name for r in runs] == ["boss"]
    assert result.incomplete and result.stop_reason == "budget"


async def test_an_incomplete_task_reports_to_its_dependents_and_fail_fast_holds(
    tmp_path: Path,
) -> None:
    def digger(request: ModelRequest) -> object:
        return researcher_policy("dig")(request)

    def writer(request: ModelRequest) -> object:
        return "Written from: " + request.messages[0].text

    graph = Graph(
        name="g",
        fail_fast=True,
        tasks=[
            Task(
                id="dig",
                agent=Agent(name="digger", model="dig", tools=[lookup], max_turns=3),
                prompt="dig",
            ),
            Task(
                id="write",
                agent=Agent(name="writer", model="write"),
                prompt="write",
                depends_on=["dig"],
            ),
        ],
    )
    model = routed(dig=digger, write=writer)
    async with served(model, tmp_path / "g.db") as rt:
        result = await rt.run_graph(graph)
        again = await rt.resume(result.session_id)
    assert result.tasks["dig"].status == "incomplete"
    assert result.tasks["dig"].stop_reason == "max_turns"
    assert result.tasks["write"].status == "done"
    assert result.status == "done" and result.incomplete and result.stop_reason == "max_turns"
    assert result.failed == []
    assert {"FACT-dig-0", "FACT-dig-1", "FACT-dig-2"} <= facts_in(result.output)
    assert 'incomplete="stopped by its turn limit (max_turns=3)"' in result.output
    assert again.model_dump() == result.model_dump()


async def test_budgets_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="per= applies to tenant budgets"):
        Agent(name="a", budget=Budget(max_tokens=10, per="day"))
    with pytest.raises(ValueError):
        Budget(max_tokens=10, soft=1.5)
    with pytest.raises(ValueError):
        Budget(max_tokens=0)
    async with Runtime(db=tmp_path / "v.db", model=FunctionModel(lambda r: "ok")) as rt:
        with pytest.raises(Exception, match="per= applies to tenant budgets"):
            await rt.run(Agent(name="a"), "go", budget=Budget(max_tokens=10, per="month"))
        with pytest.raises(Exception, match="tenant must be a non-empty string"):
            await rt.run(Agent(name="a"), "go", tenant=" ")
