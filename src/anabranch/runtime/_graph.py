"""The graph scheduler: runs a ``Graph`` (a DAG of agent tasks) in one session.

Each task is a root-level agent run with ``task_id`` set. Ready tasks run concurrently
(bounded by ``max_concurrency``); a task's first message is its prompt plus the capped
reports of its dependencies. A failed task fails its dependents while independent branches
finish; ``fail_fast`` cancels everything instead. Resuming an interrupted graph keeps
finished tasks, continues unfinished runs where they stopped and starts the rest.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from anabranch.agents import Graph, Task
from anabranch.runtime._children import (
    RunOutcome,
    capped_report,
    drive_to_outcome,
    open_run,
    settle_subtree,
)
from anabranch.runtime._environment import Environment
from anabranch.runtime._loader import resolve_recorded
from anabranch.runtime._results import GraphResult, TaskResult, build_result
from anabranch.runtime._run_limits import parse_stop
from anabranch.runtime._session import SessionDriver, SessionEnd
from anabranch.store import RunRecord, SessionRecord, Store
from anabranch.traces import SpanRef

__all__ = [
    "drive_graph",
    "graph_outline",
    "graph_task",
    "resolve_graph",
    "resume_graph",
    "stored_graph_result",
    "task_prompt",
]

_REPORTED = ("done", "incomplete")
"""Statuses of tasks that ended with a report (their dependents run)."""
FAIL_FAST_NOT_RUN = "cancelled: not run because another task failed (fail_fast)"


def graph_task(graph: Graph) -> str:
    """The task text a graph session is recorded with."""
    return f"graph {graph.name}: {', '.join(t.id for t in graph.tasks)}"


def graph_outline(graph: Graph) -> dict[str, Any]:
    """The structure of a graph, recorded with its session (for ``show``)."""
    return {
        "name": graph.name,
        "max_concurrency": graph.max_concurrency,
        "fail_fast": graph.fail_fast,
        "tasks": [
            {
                "id": t.id,
                "agent": t.agent.name,
                "model": t.agent.model,
                "window": t.agent.context.window,
                "threshold": t.agent.context.threshold,
                "depends_on": list(t.depends_on),
                **({"budget": t.agent.budget.model_dump(mode="json")} if t.agent.budget else {}),
            }
            for t in graph.tasks
        ],
    }


def resolve_graph(
    session: SessionRecord, graphs: Mapping[str, Graph], register: Callable[[Graph], None]
) -> Graph:
    """The graph of a session: registered by name, or loaded from its source (and then
    registered)."""
    return resolve_recorded(
        session,
        Graph,
        graphs,
        register,
        hint="register it with rt.register(graph) or Runtime(graphs=[...]) first",
    )


async def resume_graph(
    env: Environment, driver: SessionDriver, graph: Graph, session: SessionRecord
) -> GraphResult:
    """Continue an interrupted graph session; a finished one returns its stored result."""
    if _graph_ended(session) is not None:
        return await stored_graph_result(env.store, graph, session.id)

    async def ended() -> SessionEnd | None:  # read again under the lease
        return _graph_ended(await env.store.get_session(session.id))

    return await drive_graph(env, driver, graph, resumed=True, ended=ended)


def _graph_ended(session: SessionRecord | None) -> SessionEnd | None:
    """A graph session's end, if it has ended (a failed graph is not resumed)."""
    if session is None or session.finished is None:
        return None
    if session.status == "done" or session.status == "incomplete" or session.status == "failed":
        return SessionEnd(session.status, output=session.output or "", error=session.error)
    return None


async def stored_graph_result(store: Store, graph: Graph, session_id: str) -> GraphResult:
    """The result of a finished graph session, from the store (nothing runs)."""
    results = _stored_results(graph, await _task_runs(store, session_id))
    filled = _fill_unrun(graph, results, FAIL_FAST_NOT_RUN)
    return await _result(store, session_id, graph, filled, _end(graph, filled))


async def _task_runs(store: Store, session_id: str) -> dict[str, RunRecord]:
    runs = await store.list_runs(session_id)
    return {r.task_id: r for r in runs if r.task_id is not None and r.parent_run_id is None}


def _stored_results(graph: Graph, runs: dict[str, RunRecord]) -> dict[str, TaskResult]:
    """Results of the tasks whose runs have finished (they are never run again)."""
    results: dict[str, TaskResult] = {}
    for task in graph.tasks:
        record = runs.get(task.id)
        if record is None or record.status == "running":
            continue
        results[task.id] = _task_result(task, RunOutcome.of_record(record))
    return results


def _task_result(task: Task, outcome: RunOutcome) -> TaskResult:
    reason, _ = parse_stop(outcome.stop)
    return TaskResult(
        id=task.id,
        agent=task.agent.name,
        status=outcome.status,
        report=outcome.output,
        run_id=outcome.run_id,
        error=outcome.error if outcome.status != "incomplete" else outcome.stop,
        stop_reason=reason,
    )


def _fill_unrun(graph: Graph, results: dict[str, TaskResult], reason: str) -> dict[str, TaskResult]:
    """Results for tasks that never finished: failed if a dependency failed, else cancelled."""
    filled = dict(results)
    for task in graph.order():
        if task.id in filled:
            continue
        failed = [d for d in task.depends_on if filled[d].status == "failed"]
        filled[task.id] = TaskResult(
            id=task.id,
            agent=task.agent.name,
            status="failed" if failed else "cancelled",
            error=f"not run: dependency {failed[0]!r} failed" if failed else reason,
        )
    return {t.id: filled[t.id] for t in graph.tasks}


async def task_prompt(
    env: Environment, graph: Graph, task: Task, done: dict[str, TaskResult]
) -> str:
    """The task's first message: its prompt, then each dependency's capped report."""
    parts = [task.prompt]
    if task.depends_on:
        parts.append("Reports from the tasks this one depends on:")
    for dep_id in task.depends_on:
        dep = done[dep_id]
        cap = graph.task(dep_id).agent.max_report_tokens
        run_id = dep.run_id or ""
        report = await capped_report(
            env.store, dep.report, cap, run_id=run_id, owner_run_id=run_id, call_id=f"task:{dep_id}"
        )
        mark = ""
        if dep.status == "incomplete":
            _, why = parse_stop(dep.error)
            mark = f' incomplete="{why or "stopped by a limit"}"'
        parts.append(f'<report task="{dep_id}" agent="{dep.agent}"{mark}>\n{report}\n</report>')
    return "\n\n".join(parts)


@dataclass
class _Schedule:
    env: Environment
    graph: Graph
    runs: dict[str, RunRecord]
    results: dict[str, TaskResult]
    launched: set[str] = field(default_factory=set)
    stopped_by: str | None = None
    """The task whose failure made ``fail_fast`` cancel the rest."""

    async def run(self) -> dict[str, TaskResult]:
        self.launched = set(self.results)
        limiter = anyio.CapacityLimiter(self.graph.max_concurrency)
        async with anyio.create_task_group() as group:

            def launch() -> None:
                for task in self.graph.order():
                    if task.id in self.launched:
                        continue
                    deps = [self.results.get(d) for d in task.depends_on]
                    if any(d is not None and d.status not in _REPORTED for d in deps):
                        continue  # _fill_unrun records why it never ran
                    if all(d is not None for d in deps):
                        self.launched.add(task.id)
                        group.start_soon(run_one, task)

            async def run_one(task: Task) -> None:
                async with limiter:
                    if self.stopped_by is not None:
                        return  # fail_fast: never start another task
                    result = await self._run_task(task)
                self.results[task.id] = result
                if result.status == "failed" and self.graph.fail_fast:
                    self.stopped_by = task.id
                    group.cancel_scope.cancel()
                    return
                launch()

            launch()
        reason = f"cancelled: task {self.stopped_by!r} failed (fail_fast)"
        return _fill_unrun(self.graph, self.results, reason)

    async def _run_task(self, task: Task) -> TaskResult:
        try:
            prompt = await task_prompt(self.env, self.graph, task, self.results)
            run = await open_run(
                self.env, task.agent, self.runs.get(task.id), prompt, task_id=task.id, mode="task"
            )
            outcome = await drive_to_outcome(run)
        except anyio.get_cancelled_exc_class():
            if self.stopped_by is not None:
                with anyio.CancelScope(shield=True):
                    await self._cancel_run(task)
            raise
        return _task_result(task, outcome)

    async def _cancel_run(self, task: Task) -> None:
        """Record fail_fast's cancellation on the task's run (if it was created)."""
        store, session_id = self.env.store, self.env.session_id
        for record in await store.list_runs(session_id):
            if record.task_id == task.id and record.parent_run_id is None:
                reason = f"cancelled: task {self.stopped_by!r} failed (fail_fast)"
                await settle_subtree(store, session_id, record.id, "cancelled", reason)


def _end(graph: Graph, results: dict[str, TaskResult]) -> SessionEnd:
    """How a graph session ended: done if every task is, incomplete if some task was
    stopped by a limit (and none failed), else failed naming each failure."""
    sinks = [results[t.id] for t in graph.sinks()]
    if len(sinks) == 1:
        output = sinks[0].report
    else:
        output = "\n\n".join(f"## {r.id}\n{r.report}" for r in sinks if r.status in _REPORTED)
    errors = [f"{r.id}: {r.error}" for r in results.values() if r.status not in _REPORTED]
    if errors:
        return SessionEnd("failed", output=output, error="; ".join(errors))
    if any(r.status == "incomplete" for r in results.values()):
        return SessionEnd("incomplete", output=output)
    return SessionEnd("done", output=output)


async def _result(
    store: Store,
    session_id: str,
    graph: Graph,
    results: dict[str, TaskResult],
    end: SessionEnd,
) -> GraphResult:
    result = await build_result(
        store,
        session_id,
        run_id="",
        agent=graph.name,
        status=end.status,
        output=end.output,
        error=end.error,
        cause=end.cause,
        tasks=results,
    )
    assert isinstance(result, GraphResult)
    return result


async def drive_graph(
    env: Environment,
    driver: SessionDriver,
    graph: Graph,
    *,
    resumed: bool = False,
    ended: Callable[[], Awaitable[SessionEnd | None]] | None = None,
) -> GraphResult:
    """Schedule the graph under the session driver (lease, status, cancellation;
    ``ended``: see ``SessionDriver.drive``)."""
    session_id, store, tracing = env.session_id, env.store, env.tracing
    results: dict[str, TaskResult] = {}

    async def body() -> SessionEnd:
        runs = await _task_runs(store, session_id)
        schedule = _Schedule(env, graph, runs, _stored_results(graph, runs))
        earlier = [SpanRef(t, s) for t, s in await store.run_spans(session_id)]
        with tracing.graph_run(
            graph=graph.name, session_id=session_id, tasks=len(graph.tasks), resumed_from=earlier
        ) as span:
            ref = tracing.span_ref(span)
            if ref is not None:  # a graph's own span is kept under its session id
                await store.add_run_span(session_id, session_id, ref.trace_id, ref.span_id)
            results.update(await schedule.run())
        return _end(graph, results)

    async def result(end: SessionEnd) -> GraphResult:
        if not results:  # the schedule itself failed: every task is reported as stored
            stored = _stored_results(graph, await _task_runs(store, session_id))
            results.update(_fill_unrun(graph, stored, end.error or "not run"))
        return await _result(store, session_id, graph, results, end)

    return await driver.drive(
        session_id, body, result=result, task=graph_task(graph), resumed=resumed, ended=ended
    )
