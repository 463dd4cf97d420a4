"""``Runtime``'s verbs that open, run and continue sessions (``open_session``, ``run``,
``run_graph``, ``resume``, ``send``), with a new session's record and the budget checks
before it. Functions of the runtime (``SessionHost``: the part of it they use), bound as
``Runtime``'s methods: callers see one class, and no call goes through a wrapper.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

from anabranch.agents import Agent, Budget, Graph
from anabranch.errors import SessionNotFoundError, UserError
from anabranch.messages import Document, Image, valid_text
from anabranch.models._base import Model
from anabranch.runtime._agent_resume import resume_agent
from anabranch.runtime._agent_session import drive_agent
from anabranch.runtime._budgets import check_budget, refuse_start
from anabranch.runtime._conversation import check_message, finished_root
from anabranch.runtime._definitions import MODEL_CLIENT_KEY, agent_outline, client_name
from anabranch.runtime._environment import Environment
from anabranch.runtime._graph import (
    drive_graph,
    graph_outline,
    graph_task,
    resolve_graph,
    resume_graph,
)
from anabranch.runtime._loader import DIGEST_KEY, source_digest
from anabranch.runtime._loop import AgentRun, new_id
from anabranch.runtime._memory import memory_session_start
from anabranch.runtime._results import GraphResult, RunResult
from anabranch.runtime._session import SessionDriver
from anabranch.runtime._task_input import task_message, task_text
from anabranch.store import SessionRecord, Store

__all__ = [
    "SessionHost",
    "check_limits",
    "open_session",
    "resume",
    "run",
    "run_graph",
    "send",
    "session_record",
]


class SessionHost(Protocol):
    """What of ``Runtime`` its session verbs use."""

    _agents: dict[str, Agent]
    _model: Model | None
    graphs: dict[str, Graph]
    budgets: dict[str, Budget]
    session_notes: dict[str, Any]

    @property
    def store(self) -> Store: ...

    @property
    def model(self) -> Model: ...

    @property
    def _driver(self) -> SessionDriver: ...

    def register(self, *definitions: Agent | Graph) -> None: ...

    def resolve_agent(self, session: SessionRecord, agent: Agent | None = None) -> Agent: ...

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

    async def session_environment(
        self,
        session_id: str,
        *,
        budget: Budget | None = None,
        tenant: str | None = None,
        fresh: bool = False,
    ) -> Environment: ...


async def check_limits(
    rt: SessionHost, what: str, budget: Budget | None, tenant: str | None
) -> None:
    """Before a new session of ``what``: its budget arguments, and the tenant's budget left."""
    check_budget(budget, tenant)  # bad arguments, or no budget left: one-line errors
    await refuse_start(rt.store, what, budget, tenant, rt.budgets)


def session_record(
    rt: SessionHost,
    kind: Literal["agent", "graph"],
    entry: str,
    task: str,
    source: str | None,
    outline: dict[str, Any],
    *,
    drive: bool = True,
) -> SessionRecord:
    """A new session's record (see ``Runtime.open_session``)."""
    client = client_name(rt.model) if drive or rt._model is not None else None
    outline = {**rt.session_notes, **outline, MODEL_CLIENT_KEY: client}
    if source is not None:
        # resume runs this file again only while it is byte for byte the same
        outline[DIGEST_KEY] = source_digest(source)
    return SessionRecord(
        id=new_id("ses"),
        created=time.time(),
        kind=kind,
        entry=entry,
        task=task,
        source=source,
        definition=json.dumps(outline),
    )


async def open_session(
    rt: SessionHost,
    *,
    kind: Literal["agent", "graph"],
    entry: str,
    task: str,
    source: str | None,
    outline: dict[str, Any],
    on_session: Callable[[str], None] | None,
    drive: bool = True,
) -> str:
    """Commit a new session and announce its id (before anything runs in it).

    ``drive``: this process runs it, so its model client is created first (missing
    credentials fail before a session exists). A session queued for workers is not.
    """
    session = session_record(rt, kind, entry, task, source, outline, drive=drive)
    await rt.store.create_session(session)
    if on_session is not None:
        on_session(session.id)
    return session.id


async def run(
    rt: SessionHost,
    agent: Agent,
    task: str | Sequence[str | Image | Document],
    *,
    source: str | None = None,
    on_session: Callable[[str], None] | None = None,
    budget: Budget | None = None,
    tenant: str | None = None,
) -> RunResult:
    """Run ``agent`` on ``task`` in a new session and return its result.

    A session that fails returns ``status="failed"`` (see ``RunResult.raise_for_status``);
    after a model failure it stays resumable.

    Args:
        task: the request: a string, or a list of strings, ``Image`` and ``Document``
            (one user turn, in that order).
        source: ``file.py:name`` the agent came from, so another process can resume it.
        on_session: called with the session id as soon as the session is committed.
        budget: what the whole session may spend (at it: reports, ``incomplete``).
        tenant: who the session spends for (``Runtime(budgets=...)``).

    Raises:
        UserError: not an agent, an empty task, a bad budget or tenant.
        BudgetExceeded: the tenant has no budget left.
    """
    if not isinstance(agent, Agent):
        raise UserError(f"run() needs an Agent, got {type(agent).__name__}")
    first = task_message(task)
    text = valid_text(task) if isinstance(task, str) else task_text(first)
    await check_limits(rt, repr(agent.name), budget, tenant)
    rt.register(agent)
    session = session_record(rt, "agent", agent.name, text, source, agent_outline(agent))
    session_id = session.id
    async with rt._driver.opening(session):  # committed with its lease: one write
        if on_session is not None:
            on_session(session_id)
        env = await rt.session_environment(session_id, budget=budget, tenant=tenant, fresh=True)

    async def start() -> AgentRun:
        await memory_session_start(env, agent)
        return await AgentRun.start(env, agent, [first], with_drive=True)

    return await drive_agent(
        rt._driver,
        rt.store,
        rt._agents,
        session_id,
        agent.name,
        start,
        task=text,
        taken=True,
    )


async def run_graph(
    rt: SessionHost,
    graph: Graph,
    *,
    source: str | None = None,
    on_session: Callable[[str], None] | None = None,
    budget: Budget | None = None,
    tenant: str | None = None,
) -> GraphResult:
    """Run a task graph in a new session; returns every task's status and report.

    A failed task shows in ``GraphResult.tasks`` (and ``status`` is ``failed``), the
    same rule as ``run``. A task stopped by a limit is ``incomplete``: its report still
    goes to its dependents. ``budget`` and ``tenant`` work as for ``run``. Resume an
    interrupted graph with ``resume(session_id)``.
    """
    if not isinstance(graph, Graph):
        raise UserError(f"run_graph() needs a Graph, got {type(graph).__name__}")
    await check_limits(rt, f"graph {graph.name!r}", budget, tenant)
    rt.register(graph)
    session_id = await rt.open_session(
        kind="graph",
        entry=graph.name,
        task=graph_task(graph),
        source=source,
        outline=graph_outline(graph),
        on_session=on_session,
    )
    env = await rt.session_environment(session_id, budget=budget, tenant=tenant, fresh=True)
    return await drive_graph(env, rt._driver, graph)


async def resume(
    rt: SessionHost, session_id: str, agent: Agent | None = None, *, budget: Budget | None = None
) -> RunResult:
    """Continue a session from wherever it stopped; a finished one returns its result
    (a ``GraphResult`` for a graph session). The failure rule is ``run``'s.

    ``budget``: a new budget for the session (its spend so far counts); a session a
    limit stopped then continues. Without it the session keeps its budget.

    Raises:
        SessionNotFoundError: no such session.
        SessionBusyError: another live process is driving it.
    """
    check_budget(budget)
    session = await rt.store.get_session(session_id)
    if session is None:
        raise SessionNotFoundError(session_id)
    if session.kind == "graph":
        graph = resolve_graph(session, rt.graphs, rt.register)
        env = await rt.session_environment(session_id, budget=budget)
        return await resume_graph(env, rt._driver, graph, session)
    if session.kind != "agent":
        raise UserError(f"cannot resume a session of kind {session.kind!r}")
    return await resume_agent(
        rt._driver,
        rt.store,
        rt._agents,
        session,
        resolve=lambda: rt.resolve_agent(session, agent),
        environment=lambda: rt.session_environment(session_id, budget=budget),
        budget=budget,
    )


async def send(
    rt: SessionHost,
    session_id: str,
    message: str,
    agent: Agent | None = None,
    *,
    budget: Budget | None = None,
) -> RunResult:
    """Continue a finished session's conversation: ``message`` becomes the root
    agent's next user turn, in the same context (compaction, snapshot and the
    write-ahead log apply as to any turn). Returns this turn's result (the failure
    rule is ``run``'s). ``budget``: a new budget for the session from this turn on
    (default: the one it had; its spend so far counts against it).

    Raises:
        SessionNotFoundError: no such session.
        UserError: not an agent session, or its last turn is unfinished (resume it)
            or failed.
    """
    text = check_message(message)
    root_agent, root = await finished_root(
        rt.store, session_id, lambda session: rt.resolve_agent(session, agent)
    )
    check_budget(budget)
    env = await rt.session_environment(session_id, budget=budget)

    async def load_and_continue() -> AgentRun:
        run = await AgentRun.load(env, root_agent, root)
        await run.continue_with(text)
        return run

    return await drive_agent(
        rt._driver,
        rt.store,
        rt._agents,
        session_id,
        root_agent.name,
        load_and_continue,
        task=text,
    )
