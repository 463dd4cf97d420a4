"""Queued sessions: ``Runtime.submit`` and ``Runtime.wait``.

``submit`` commits the session (an agent's or a graph's), then enqueues its DBOS workflow
(``_dispatch``) for the worker processes; ``wait`` polls the store until a worker finished
the session. Both need PostgreSQL; DBOS is imported only when a session is submitted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

import anyio

from anabranch.agents import Agent, Graph
from anabranch.errors import SessionNotFoundError, UserError
from anabranch.runtime._definitions import agent_outline
from anabranch.runtime._graph import graph_outline, graph_task, stored_graph_result
from anabranch.runtime._results import RunResult, build_result
from anabranch.store import SessionRecord, Store, is_postgres_url

__all__ = ["defines", "submit", "wait"]

POLL_FIRST = 0.05
POLL_MAX = 1.0


class Runtime(Protocol):
    """What of ``Runtime`` queued sessions use."""

    _db: str
    db: str
    _submitter: Any
    _agents: dict[str, Agent]
    graphs: dict[str, Graph]

    @property
    def store(self) -> Store: ...

    def register(self, *definitions: Agent | Graph) -> None: ...

    async def open_session(
        self,
        *,
        kind: Literal["agent", "graph"],
        entry: str,
        task: str,
        source: str | None,
        outline: dict[str, Any],
        on_session: Callable[[str], None] | None,
        drive: bool = True,
    ) -> str: ...

    async def resume(self, session_id: str, agent: Agent | None = None) -> RunResult: ...


def _postgres_dsn(rt: Runtime, what: str) -> str:
    dsn = rt._db
    if not is_postgres_url(dsn):
        raise UserError(f"{what} needs a PostgreSQL database (db='postgresql://...'), not {rt.db}")
    return dsn


async def submit(
    rt: Runtime,
    definition: Agent | Graph,
    task: str | None,
    *,
    queue: str | None,
    source: str | None,
) -> str:
    """Commit a new agent or graph session, undriven, and enqueue it for the workers."""
    kind: Literal["agent", "graph"]
    if isinstance(definition, Graph):
        if task is not None:
            raise UserError(f"graph {definition.name!r}: its tasks carry their prompts; no task")
        kind, text, outline = "graph", graph_task(definition), graph_outline(definition)
    elif isinstance(definition, Agent):
        if not isinstance(task, str) or not task.strip():
            raise UserError("the task must be a non-empty string")
        kind, text, outline = "agent", task, agent_outline(definition)
    else:
        raise UserError(f"submit() needs an Agent or a Graph, got {type(definition).__name__}")
    dsn = _postgres_dsn(rt, "submit")
    from anabranch.runtime._dispatch import DEFAULT_QUEUE, Submitter

    rt.register(definition)
    session_id = await rt.open_session(
        kind=kind,
        entry=definition.name,
        task=text,
        source=source,
        outline=outline,
        on_session=None,
        drive=False,  # a worker drives it, with its own model client
    )
    if rt._submitter is None:
        rt._submitter = Submitter(dsn)
    await rt._submitter.enqueue(session_id, queue or DEFAULT_QUEUE)
    return session_id


async def wait(rt: Runtime, session_id: str, timeout: float | None) -> RunResult:  # noqa: ASYNC109
    delay = POLL_FIRST
    session: SessionRecord | None = None
    with anyio.move_on_after(timeout):
        while True:
            session = await rt.store.get_session(session_id)
            if session is None:
                raise SessionNotFoundError(session_id)
            if _finished(session):
                break
            await anyio.sleep(delay)
            delay = min(delay * 1.5, POLL_MAX)
    if session is None or not _finished(session):
        raise UserError(f"session {session_id} did not finish within {timeout:g} s")
    graph = rt.graphs.get(session.entry) if session.kind == "graph" else None
    if graph is not None:  # every task's result, from the store
        return await stored_graph_result(rt.store, graph, session_id)
    # an agent's result, or a graph's that this process does not define: its status and
    # output from the store (no definition file is imported to read a result)
    runs = await rt.store.list_runs(session_id)
    root = next((r for r in runs if r.parent_run_id is None and r.task_id is None), None)
    return await build_result(
        rt.store,
        session_id,
        run_id=root.id if root else "",
        agent=session.entry,
        status=_ended(session),
        output=session.output if session.status != "failed" else (root.output if root else ""),
        error=session.error,
    )


def _finished(session: SessionRecord) -> bool:
    return session.status in ("done", "incomplete", "failed") and session.finished is not None


def _ended(session: SessionRecord) -> Literal["done", "incomplete", "failed"]:
    if session.status in ("done", "incomplete"):
        return "done" if session.status == "done" else "incomplete"
    return "failed"


def defines(rt: Runtime, session: SessionRecord) -> bool:
    known = rt.graphs if session.kind == "graph" else rt._agents
    return session.entry in known
