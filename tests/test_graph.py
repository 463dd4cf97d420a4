"""Task graphs: validation, ordering, report injection, concurrency, failure policies,
resume."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pydantic
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from anabranch import Agent, ContextPolicy, Graph, GraphResult, Runtime, Task, tool
from anabranch.errors import ModelAPIError
from anabranch.messages import ModelRequest
from anabranch.runtime._report import session_tree
from anabranch.testing import TestModel

from .subagent_helpers import (
    assert_store_consistent,
    eventually,
    first_turn,
    overlaps,
    requests_for,
    routed,
    text_of,
    use,
)

pytestmark = pytest.mark.anyio

SMALL = ContextPolicy(window=8_000, output_reserve=500)


def _agent(name: str, **kwargs: Any) -> Agent:
    return Agent(name=name, model=name, context=SMALL, **kwargs)


def _diamond(branch_a: Agent, branch_b: Agent, **kwargs: Any) -> Graph:
    return Graph(
        tasks=[
            Task(id="plan", agent=_agent("planner"), prompt="Make a plan."),
            Task(id="left", agent=branch_a, prompt="Do the left half.", depends_on=["plan"]),
            Task(id="right", agent=branch_b, prompt="Do the right half.", depends_on=["plan"]),
            Task(id="merge", agent=_agent("merger"), prompt="Merge.", depends_on=["left", "right"]),
        ],
        **kwargs,
    )


# ---------------------------------------------------------------- validation


def _task(task_id: str, *deps: str) -> Task:
    return Task(id=task_id, agent=_agent("x"), prompt="p", depends_on=deps)


@pytest.mark.parametrize(
    ("tasks", "message"),
    [
        ([_task("a"), _task("a")], "duplicate task ids: a"),
        ([_task("a", "ghost")], "unknown dependencies: a -> ghost"),
        ([_task("a", "b"), _task("b", "c"), _task("c", "a")], "dependency cycle: a -> b -> c -> a"),
        ([_task("a", "a")], "dependency cycle: a -> a"),
    ],
)
def test_invalid_graphs_are_rejected_naming_the_problem(tasks: list[Task], message: str) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        Graph(tasks=tasks)
    assert message in str(info.value)


def test_empty_graph_and_bad_limits_are_rejected() -> None:
    with pytest.raises(pydantic.ValidationError):
        Graph(tasks=[])
    with pytest.raises(pydantic.ValidationError):
        Graph(tasks=[_task("a")], max_concurrency=0)


def test_order_puts_dependencies_first() -> None:
    graph = Graph(tasks=[_task("d", "b", "c"), _task("c", "a"), _task("b", "a"), _task("a")])
    assert [t.id for t in graph.order()] == ["a", "c", "b", "d"]
    assert [t.id for t in graph.sinks()] == ["d"]


# ---------------------------------------------------------------- running


async def test_diamond_runs_in_order_with_reports_not_transcripts(tmp_path: Path) -> None:
    left_started, right_started = anyio.Event(), anyio.Event()

    @tool(timeout=10)
    async def left_tool() -> str:
        """Left work."""
        left_started.set()
        await right_started.wait()
        return "LEFT-TRANSCRIPT-DETAIL"

    @tool(timeout=10)
    async def right_tool() -> str:
        """Right work."""
        right_started.set()
        await left_started.wait()
        return "RIGHT-TRANSCRIPT-DETAIL"

    def worker(name: str, report: str) -> Callable[[ModelRequest], object]:
        def answer(request: ModelRequest) -> object:
            return [use(name, f"toolu_{name}")] if first_turn(request) else report

        return answer

    model = routed(
        planner=lambda r: "PLAN: split in two",
        lefty=worker("left_tool", "LEFT-REPORT"),
        righty=worker("right_tool", "RIGHT-REPORT"),
        merger=lambda r: "MERGED",
    )
    graph = _diamond(
        _agent("lefty", tools=[left_tool]), _agent("righty", tools=[right_tool]), max_concurrency=2
    )
    async with Runtime(db=tmp_path / "g.db", model=model) as rt:
        result = await rt.run_graph(graph)
        runs = {r.task_id: r for r in await rt.store.list_runs(result.session_id)}
        await assert_store_consistent(rt.store, result.session_id)
    assert isinstance(result, GraphResult)
    assert result.status == "done" and result.output == "MERGED" and result.error is None
    assert {k: v.status for k, v in result.tasks.items()} == dict.fromkeys(
        ["plan", "left", "right", "merge"], "done"
    )
    assert result.tasks["left"].report == "LEFT-REPORT"
    assert result.tasks["left"].run_id == runs["left"].id
    for run in runs.values():
        assert run.parent_run_id is None and run.depth == 0 and run.finished is not None
    plan, left, right, merge = (runs[k] for k in ("plan", "left", "right", "merge"))
    assert plan.finished is not None and left.finished is not None
    assert right.finished is not None
    assert plan.finished <= left.created and plan.finished <= right.created
    assert max(left.finished, right.finished) <= merge.created
    assert overlaps(left, right), "ready branches run concurrently"
    (left_request,) = requests_for(model, "lefty")[:1]
    assert "PLAN: split in two" in left_request.messages[0].text
    merge_request = requests_for(model, "merger")[0]
    merge_prompt = merge_request.messages[0].text
    assert merge_prompt.startswith("Merge.")
    assert "LEFT-REPORT" in merge_prompt and "RIGHT-REPORT" in merge_prompt
    assert "TRANSCRIPT-DETAIL" not in text_of(merge_request)
    assert "PLAN: split in two" not in merge_prompt, "only direct dependencies' reports"


async def test_max_concurrency_one_runs_ready_tasks_one_at_a_time(tmp_path: Path) -> None:
    graph = Graph(
        tasks=[Task(id=f"t{i}", agent=_agent("w"), prompt=f"job {i}") for i in range(3)],
        max_concurrency=1,
    )
    async with Runtime(db=tmp_path / "c.db", model=TestModel()) as rt:
        result = await rt.run_graph(graph)
        runs = sorted(await rt.store.list_runs(result.session_id), key=lambda r: r.created)
    assert result.status == "done" and len(runs) == 3
    for earlier, later in zip(runs, runs[1:], strict=False):
        assert not overlaps(earlier, later)
    assert "## t0" in result.output and "## t2" in result.output  # several sinks


async def test_run_graph_opens_its_session_through_the_runtime_method(tmp_path: Path) -> None:
    """A ``Runtime`` subclass that wraps ``open_session`` sees the graph session opened."""
    opened: list[str] = []

    class RecordingRuntime(Runtime):
        async def open_session(self, **kwargs: Any) -> str:
            session_id: str = await super().open_session(**kwargs)
            opened.append(session_id)
            return session_id

    graph = Graph(tasks=[Task(id="only", agent=_agent("w"), prompt="job")])
    async with RecordingRuntime(db=tmp_path / "o.db", model=TestModel()) as rt:
        result = await rt.run_graph(graph)
    assert result.status == "done"
    assert opened == [result.session_id]


async def test_dependency_reports_are_capped(tmp_path: Path) -> None:
    long = "word " * 1_000
    graph = Graph(
        tasks=[
            Task(id="big", agent=_agent("big", max_report_tokens=20), prompt="write"),
            Task(id="use", agent=_agent("user"), prompt="read", depends_on=["big"]),
        ]
    )
    model = routed(big=lambda r: long, user=lambda r: "fine")
    async with Runtime(db=tmp_path / "cap.db", model=model) as rt:
        result = await rt.run_graph(graph)
        spilled = await rt.store.get_spill(f"report_{result.tasks['big'].run_id}")
    prompt = requests_for(model, "user")[0].messages[0].text
    assert f"recall id=report_{result.tasks['big'].run_id}" in prompt
    assert len(prompt) < 20 * 4 + 400
    assert spilled == long and result.tasks["big"].report == long
    assert "under 20 tokens" in requests_for(model, "big")[0].system[0].text


def _failing(request: ModelRequest) -> object:
    raise ModelAPIError("invalid_request_error: broken on purpose", status_code=400)


async def test_failed_task_fails_dependents_and_independent_branches_finish(
    tmp_path: Path,
) -> None:
    graph = Graph(
        tasks=[
            Task(id="plan", agent=_agent("planner"), prompt="plan"),
            Task(id="bad", agent=_agent("bad"), prompt="x", depends_on=["plan"]),
            Task(id="good", agent=_agent("good"), prompt="y", depends_on=["plan"]),
            Task(id="after_bad", agent=_agent("m"), prompt="z", depends_on=["bad", "good"]),
            Task(id="after_after", agent=_agent("m"), prompt="z", depends_on=["after_bad"]),
            Task(id="lonely", agent=_agent("lonely"), prompt="alone"),
        ]
    )
    model = routed(
        planner=lambda r: "plan", bad=_failing, good=lambda r: "good", lonely=lambda r: "alone"
    )
    async with Runtime(db=tmp_path / "f.db", model=model) as rt:
        result = await rt.run_graph(graph)
        task_ids = {r.task_id for r in await rt.store.list_runs(result.session_id)}
        session = await rt.store.get_session(result.session_id)
        again = await rt.resume(result.session_id)
    status = {k: v.status for k, v in result.tasks.items()}
    assert status == {
        "plan": "done",
        "bad": "failed",
        "good": "done",
        "after_bad": "failed",
        "after_after": "failed",
        "lonely": "done",
    }
    assert "broken on purpose" in (result.tasks["bad"].error or "")
    assert result.tasks["after_bad"].error == "not run: dependency 'bad' failed"
    assert result.tasks["after_after"].error == "not run: dependency 'after_bad' failed"
    assert result.tasks["after_bad"].run_id is None
    assert task_ids == {"plan", "bad", "good", "lonely"}
    assert result.status == "failed" and "bad" in (result.error or "")
    assert sorted(result.failed) == ["after_after", "after_bad", "bad"]
    assert session is not None and session.status == "failed"
    assert isinstance(again, GraphResult) and again.tasks == result.tasks


async def test_fail_fast_cancels_everything_else(tmp_path: Path) -> None:
    slow_started = anyio.Event()

    @tool(timeout=30)
    async def slow() -> str:
        """Takes forever."""
        slow_started.set()
        await anyio.sleep_forever()
        return "never"

    async def bad(request: ModelRequest) -> object:
        await slow_started.wait()
        return _failing(request)

    graph = Graph(
        tasks=[
            Task(id="bad", agent=_agent("bad"), prompt="x"),
            Task(id="slow", agent=_agent("slow", tools=[slow]), prompt="y"),
            Task(id="waiting", agent=_agent("w"), prompt="z"),
            Task(id="next", agent=_agent("w"), prompt="z", depends_on=["slow"]),
        ],
        max_concurrency=2,
        fail_fast=True,
    )
    model = routed(bad=bad, slow=lambda r: [use("slow", "toolu_slow")], w=lambda r: "w")
    async with Runtime(db=tmp_path / "ff.db", model=model) as rt:
        with anyio.fail_after(10):
            result = await rt.run_graph(graph)
        runs = {r.task_id: r for r in await rt.store.list_runs(result.session_id)}
        await assert_store_consistent(rt.store, result.session_id)
    status = {k: v.status for k, v in result.tasks.items()}
    assert (status["bad"], status["slow"], status["next"]) == ("failed", "cancelled", "cancelled")
    assert runs["slow"].status == "cancelled" and "fail_fast" in (runs["slow"].error or "")
    assert "next" not in runs
    # "waiting" competes for a slot; it either finished before the failure or never started
    if status["waiting"] == "done":
        assert runs["waiting"].finished <= runs["bad"].finished  # type: ignore[operator]
    else:
        assert status["waiting"] == "cancelled" and "waiting" not in runs
    assert result.status == "failed"


async def test_graph_task_children_nest_under_the_task(tmp_path: Path) -> None:
    helper = _agent("helper")
    lead = Agent(name="lead", model="lead", subagents=[helper], context=SMALL)
    graph = Graph(tasks=[Task(id="only", agent=lead, prompt="delegate")])
    async with Runtime(db=tmp_path / "n.db", model=TestModel()) as rt:
        result = await rt.run_graph(graph)
        (root,) = await session_tree(rt.store, result.session_id)
    assert root.run.task_id == "only" and root.run.agent_name == "lead"
    (child,) = root.children
    assert child.run.agent_name == "helper" and child.run.status == "done"
    assert child.run.task_id is None and child.run.depth == 1


async def test_cancelled_graph_resumes_without_redoing_finished_tasks(tmp_path: Path) -> None:
    blocked = anyio.Event()
    allow = False

    @tool(timeout=30)
    async def step() -> str:
        """Maybe block."""
        if not allow:
            blocked.set()
            await anyio.sleep_forever()
        return "stepped"

    model = routed(
        planner=lambda r: "PLAN",
        lefty=lambda r: [use("step", "toolu_step")] if first_turn(r) else "LEFT",
        righty=lambda r: "RIGHT",
        merger=lambda r: "MERGED",
    )
    graph = _diamond(_agent("lefty", tools=[step]), _agent("righty"), name="resumable")
    db = tmp_path / "r.db"
    session: list[str] = []
    async with Runtime(db=db, model=model) as rt:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:

                async def drive() -> None:
                    await rt.run_graph(graph, on_session=session.append)

                group.start_soon(drive)
                await blocked.wait()

                async def right_done() -> bool:
                    runs = await rt.store.list_runs(session[0])
                    return any(r.task_id == "right" and r.status == "done" for r in runs)

                await eventually(right_done)
                group.cancel_scope.cancel()
        before = {r.task_id: r for r in await rt.store.list_runs(session[0])}
        await assert_store_consistent(rt.store, session[0])
        status = (await rt.store.get_session(session[0])).status  # type: ignore[union-attr]
    assert status == "cancelled"
    assert before["left"].status == "running" and "merge" not in before

    allow = True
    async with Runtime(db=db, model=model, graphs=[graph]) as rt:
        result = await rt.resume(session[0])
        after = {r.task_id: r for r in await rt.store.list_runs(session[0])}
        await assert_store_consistent(rt.store, session[0])
    assert isinstance(result, GraphResult) and result.status == "done"
    assert result.output == "MERGED"
    assert after["left"].id == before["left"].id and after["left"].status == "done"
    assert len(after) == 4
    assert len(requests_for(model, "planner")) == 1 and len(requests_for(model, "righty")) == 1


async def test_resume_needs_the_graph_definition(tmp_path: Path) -> None:
    graph = Graph(tasks=[Task(id="a", agent=_agent("w"), prompt="p")], name="lost")
    async with Runtime(db=tmp_path / "x.db", model=TestModel()) as rt:
        result = await rt.run_graph(graph)
    async with Runtime(db=tmp_path / "x.db", model=TestModel()) as rt:
        with pytest.raises(Exception, match="cannot find graph 'lost'"):
            await rt.resume(result.session_id)


async def test_one_trace_per_graph_with_tasks_under_the_graph_span(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    graph = _diamond(_agent("lefty"), _agent("righty"), name="traced")
    async with Runtime(db=tmp_path / "t.db", model=TestModel(), tracer_provider=provider) as rt:
        result = await rt.run_graph(graph)
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.name == "invoke_workflow traced"]
    assert root.attributes is not None
    assert root.attributes["gen_ai.conversation.id"] == result.session_id
    tasks = [s for s in spans if s.name.startswith("invoke_agent ")]
    assert len(tasks) == 4
    assert root.context is not None
    for span in tasks:
        assert span.parent is not None and span.parent.span_id == root.context.span_id
