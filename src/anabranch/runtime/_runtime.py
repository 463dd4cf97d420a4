"""``Runtime``: opens the store and runs, resumes and reports sessions."""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.abc
from opentelemetry import trace

from anabranch.agents import Agent, Budget, Graph
from anabranch.context._pricing import PriceTable
from anabranch.errors import SessionNotFoundError, UserError
from anabranch.messages import Document, Image, Usage, valid_text
from anabranch.models._base import Model
from anabranch.models._retry import RetryPolicy
from anabranch.runtime import _queued
from anabranch.runtime._agent_resume import resume_agent
from anabranch.runtime._agent_session import drive_agent
from anabranch.runtime._approval import PendingApproval, decide, pending_approvals
from anabranch.runtime._budgets import (
    check_budget,
    check_tenant_budgets,
    open_limits,
    refuse_start,
)
from anabranch.runtime._builtins import BuiltinTool
from anabranch.runtime._compactor import CompactionOutcome
from anabranch.runtime._conversation import (
    check_message,
    compact_finished,
    finished_root,
    stream_session,
)
from anabranch.runtime._dbpath import database_path
from anabranch.runtime._definitions import (
    MODEL_CLIENT_KEY,
    agent_outline,
    client_name,
    default_builtins,
    default_pipeline,
    resolve_agent,
)
from anabranch.runtime._environment import Environment
from anabranch.runtime._event_stream import EventStream
from anabranch.runtime._events import EventBus, EventCallback
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
from anabranch.runtime._pipeline import ContextPipeline
from anabranch.runtime._results import GraphResult, RunResult, session_usage
from anabranch.runtime._rewind import rewind_run
from anabranch.runtime._run_limits import SessionLimits
from anabranch.runtime._session import SessionDriver
from anabranch.runtime._spawn import SpawnLimits
from anabranch.runtime._task_input import task_message, task_text
from anabranch.store import (
    BoundaryRecord,
    SessionRecord,
    Store,
    describe_db,
    is_postgres_url,
    open_store,
)
from anabranch.store.sqlite import Synchronous
from anabranch.traces import OpenInference, Tracing

if TYPE_CHECKING:  # the anthropic SDK is imported when the default model is first needed
    from anabranch.models._anthropic import AnthropicModel

__all__ = ["Runtime", "default_builtins", "default_pipeline"]

DEFAULT_DB = "anabranch.db"
"""Statuses of a root run that has ended with a result."""


class Runtime:
    """Runs agents against a store. Use as ``async with Runtime(db=...) as rt``.

    Args:
        db: path of the SQLite file (created owner-only) or a ``postgresql://`` DSN (needs
            the ``postgres`` extra), default ``$ANABRANCH_DB`` or ``./anabranch.db``.
        store: an open ``Store`` of any backend to use instead of opening ``db`` (the
            caller keeps it: the runtime does not close it).
        model: the model client; default ``AnthropicModel()`` (``ANTHROPIC_API_KEY``,
            ``ANTHROPIC_BASE_URL``), created on first use.
        retry: retry policy for model calls.
        tracer_provider: OpenTelemetry provider; default the global one (no-op without SDK).
        capture_content: put message content in spans (default: off, or the
            ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` variable).
        openinference: ``"full"`` adds the OpenInference keys Phoenix derives from the
            GenAI ones (default ``"minimal"``, or ``$ANABRANCH_OPENINFERENCE``).
        synchronous: SQLite ``synchronous`` level for commits.
        agents: definitions this runtime can resume by name without being given them.
        graphs: graphs this runtime can resume by name.
        spawn_limits: sub-agent limits (depth, concurrent children, report share).
        on_event: called with every event (``anabranch.events``) of every session this
            runtime drives, in order, from a task of its own: a slow callback never slows
            the run (its deltas are merged while it lags); ``run`` returns once it has
            seen the session's ``session_finished``. May be async.
        budgets: budgets per tenant (``{"acme": Budget(max_cost_usd=200, per="day")}``),
            kept in the store (every process on it shares them); ``prices``: their prices.
    """

    def __init__(
        self,
        db: str | os.PathLike[str] | None = None,
        *,
        store: Store | None = None,
        model: Model | None = None,
        retry: RetryPolicy | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        capture_content: bool | None = None,
        openinference: OpenInference | None = None,
        synchronous: Synchronous = "FULL",
        agents: Sequence[Agent] = (),
        pipeline: ContextPipeline | None = None,
        builtins: Sequence[BuiltinTool] | None = None,
        lease_ttl: float = 30.0,
        graphs: Sequence[Graph] = (),
        spawn_limits: SpawnLimits | None = None,
        on_event: EventCallback | None = None,
        budgets: Mapping[str, Budget] | None = None,
        prices: PriceTable | None = None,
    ) -> None:
        chosen = db if db is not None else os.environ.get("ANABRANCH_DB", DEFAULT_DB)
        self._db = os.fspath(chosen)
        if not is_postgres_url(self._db):
            database_path(self._db)  # no :memory:, URI or /dev/null: a session must last
        self.db = describe_db(self._db)
        """The database as it may be shown: a file path, or a DSN without its password."""
        self._model = model
        self.retry = retry or RetryPolicy()
        self.tracing = Tracing(
            tracer_provider, capture_content=capture_content, openinference=openinference
        )
        self.synchronous: Synchronous = synchronous
        self.pipeline = pipeline or default_pipeline()
        self.builtins = tuple(builtins) if builtins is not None else default_builtins()
        self.lease_ttl = lease_ttl
        self._agents: dict[str, Agent] = {a.name: a for a in agents}
        self.graphs: dict[str, Graph] = {g.name: g for g in graphs}
        self.spawn_limits = spawn_limits or SpawnLimits()
        self.budgets = check_tenant_budgets(budgets)
        self.prices = prices or PriceTable()
        self._given_store = store
        self._store: Store | None = None
        self._owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._session_driver: SessionDriver | None = None
        self.events = EventBus()
        """Every event of the sessions this runtime drives (see ``stream``)."""
        if on_event is not None and not callable(on_event):
            raise UserError("on_event must be a function taking one event")
        self.on_event = on_event
        self._created_model: AnthropicModel | None = None
        self._submitter: Any = None
        self.session_notes: dict[str, Any] = {}
        """Extra JSON recorded in the outline of each session this runtime opens (the CLI
        records its ``--model`` / ``--max-turns`` overrides there, for ``resume``)."""

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> Runtime:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def open(self, *, create: bool = True) -> None:
        if self._store is None and self._given_store is not None:
            self._store = self._given_store
        elif self._store is None:
            self._store = await open_store(
                self._db, create=create, synchronous=self.synchronous, lease_ttl=self.lease_ttl
            )
        self._session_driver = SessionDriver(
            self._store, self._owner, self.lease_ttl, events=self.events, on_event=self.on_event
        )

    async def aclose(self) -> None:
        """Close the store (unless it was given) and the model client this runtime created."""
        if self._session_driver is not None:
            driver, self._session_driver = self._session_driver, None
            await driver.aclose()
        if self._submitter is not None:
            submitter, self._submitter = self._submitter, None
            await submitter.close()
        if self._created_model is not None:
            created, self._created_model = self._created_model, None
            if self._model is created:
                self._model = None
            with anyio.CancelScope(shield=True):
                await created.aclose()
        if self._store is not None:
            store, self._store = self._store, None
            if store is not self._given_store:
                await store.close()

    @property
    def store(self) -> Store:
        if self._store is None:
            raise UserError("the runtime is not open: use 'async with Runtime(...) as rt'")
        return self._store

    @property
    def model(self) -> Model:
        if self._model is None:
            from anabranch.models._anthropic import AnthropicModel

            self._model = self._created_model = AnthropicModel()
        return self._model

    @property
    def _driver(self) -> SessionDriver:
        if self._session_driver is None:
            raise UserError("the runtime is not open: use 'async with Runtime(...) as rt'")
        return self._session_driver

    def environment(self, session_id: str, limits: SessionLimits | None = None) -> Environment:
        """The shared environment for runs of one session (under ``limits``)."""
        return Environment(
            store=self.store,
            model=self.model,
            session_id=session_id,
            retry=self.retry,
            tracing=self.tracing,
            pipeline=self.pipeline,
            builtins=self.builtins,
            extras={
                "spawn_limits": self.spawn_limits,
                "limits": limits or SessionLimits(session_id=session_id, prices=self.prices),
            },
            events=self.events,
        )

    async def session_environment(
        self,
        session_id: str,
        *,
        budget: Budget | None = None,
        tenant: str | None = None,
        fresh: bool = False,
    ) -> Environment:
        """The environment of a new (``fresh``) or continued session under its budgets."""
        given = (budget, tenant, fresh)
        limits = await open_limits(self.store, session_id, *given, self.budgets, self.prices)
        return self.environment(session_id, limits)

    async def _check_limits(self, what: str, budget: Budget | None, tenant: str | None) -> None:
        check_budget(budget, tenant)  # bad arguments, or no budget left: one-line errors
        await refuse_start(self.store, what, budget, tenant, self.budgets)

    def register(self, *definitions: Agent | Graph) -> None:
        """Make agents (and graphs) resumable by name in this process."""
        for definition in definitions:
            if isinstance(definition, Graph):
                self.graphs[definition.name] = definition
            else:
                self._agents[definition.name] = definition

    # ------------------------------------------------------------------ running
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
    ) -> str:
        """Commit a new session and announce its id (before anything runs in it).

        ``drive``: this process runs it, so its model client is created first (missing
        credentials fail before a session exists). A session queued for workers is not.
        """
        session = self._session_record(kind, entry, task, source, outline, drive=drive)
        await self.store.create_session(session)
        if on_session is not None:
            on_session(session.id)
        return session.id

    def _session_record(
        self,
        kind: Literal["agent", "graph"],
        entry: str,
        task: str,
        source: str | None,
        outline: dict[str, Any],
        *,
        drive: bool = True,
    ) -> SessionRecord:
        """A new session's record (see ``open_session``)."""
        client = client_name(self.model) if drive or self._model is not None else None
        outline = {**self.session_notes, **outline, MODEL_CLIENT_KEY: client}
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

    async def run(
        self,
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
        await self._check_limits(repr(agent.name), budget, tenant)
        self.register(agent)
        session = self._session_record("agent", agent.name, text, source, agent_outline(agent))
        session_id = session.id
        async with self._driver.opening(session):  # committed with its lease: one write
            if on_session is not None:
                on_session(session_id)
            env = await self.session_environment(
                session_id, budget=budget, tenant=tenant, fresh=True
            )

        async def start() -> AgentRun:
            await memory_session_start(env, agent)
            return await AgentRun.start(env, agent, [first], with_drive=True)

        return await drive_agent(
            self._driver,
            self.store,
            self._agents,
            session_id,
            agent.name,
            start,
            task=text,
            taken=True,
        )

    def stream(
        self,
        agent: Agent | None = None,
        task: str | None = None,
        *,
        session_id: str | None = None,
        message: str | None = None,
        source: str | None = None,
    ) -> AbstractAsyncContextManager[EventStream]:
        """Run ``agent`` on ``task`` (or send ``message`` to ``session_id``) and stream
        its events: ``async with rt.stream(agent, task) as events: async for e in events``.

        Sub-agents' events come through the same stream. Iteration ends after
        ``session_finished``; then ``events.result`` holds the ``RunResult`` (a failed
        session is a result with ``status="failed"``, as from ``run``). Leaving the block
        early cancels the run (the session stays resumable).
        """

        async def run(agent: Agent, task: str, on_session: Callable[[str], None]) -> RunResult:
            return await self.run(agent, task, source=source, on_session=on_session)

        return stream_session(self.events, run, self.send, agent, task, session_id, message)

    async def run_graph(
        self,
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
        await self._check_limits(f"graph {graph.name!r}", budget, tenant)
        self.register(graph)
        session_id = await self.open_session(
            kind="graph",
            entry=graph.name,
            task=graph_task(graph),
            source=source,
            outline=graph_outline(graph),
            on_session=on_session,
        )
        env = await self.session_environment(session_id, budget=budget, tenant=tenant, fresh=True)
        return await drive_graph(env, self._driver, graph)

    async def resume(
        self, session_id: str, agent: Agent | None = None, *, budget: Budget | None = None
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
        session = await self.store.get_session(session_id)
        if session is None:
            raise SessionNotFoundError(session_id)
        if session.kind == "graph":
            graph = resolve_graph(session, self.graphs, self.register)
            env = await self.session_environment(session_id, budget=budget)
            return await resume_graph(env, self._driver, graph, session)
        if session.kind != "agent":
            raise UserError(f"cannot resume a session of kind {session.kind!r}")
        return await resume_agent(
            self._driver,
            self.store,
            self._agents,
            session,
            resolve=lambda: self.resolve_agent(session, agent),
            environment=lambda: self.session_environment(session_id, budget=budget),
            budget=budget,
        )

    async def send(
        self,
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
            self.store, session_id, lambda session: self.resolve_agent(session, agent)
        )
        check_budget(budget)
        env = await self.session_environment(session_id, budget=budget)

        async def load_and_continue() -> AgentRun:
            run = await AgentRun.load(env, root_agent, root)
            await run.continue_with(text)
            return run

        return await drive_agent(
            self._driver,
            self.store,
            self._agents,
            session_id,
            root_agent.name,
            load_and_continue,
            task=text,
        )

    async def compact(self, session_id: str, agent: Agent | None = None) -> CompactionOutcome:
        """Compact the root agent's context of a finished turn now (``/compact``)."""
        lease = self._driver.lease
        return await compact_finished(self, lease, session_id, agent, trigger="manual")

    async def approve(
        self, session_id: str, call_id: str, *, deny: str | None = None
    ) -> PendingApproval:
        """Answer a tool call waiting for approval (``deny``: refuse it, with the reason
        the model will see). Then ``resume(session_id)`` to continue.

        Raises:
            SessionNotFoundError: no such session; UserError: no such pending call.
        """
        if await self.store.get_session(session_id) is None:
            raise SessionNotFoundError(session_id)
        if deny is not None and not isinstance(deny, str):
            raise UserError("deny must be the reason, as a string")
        return await decide(
            self.store, session_id, call_id, approved=deny is None, reason=deny or ""
        )

    async def pending_approvals(self, session_id: str) -> list[PendingApproval]:
        """The session's tool calls waiting for approval, oldest first."""
        return await pending_approvals(self.store, session_id)

    # ------------------------------------------------------------------ queued sessions
    async def submit(
        self,
        definition: Agent | Graph,
        task: str | None = None,
        *,
        queue: str | None = None,
        source: str | None = None,
    ) -> str:
        """Commit a session of an agent (with ``task``) or a graph (none: its tasks carry
        their prompts), queued for ``anabranch worker`` processes (PostgreSQL; ``queue``:
        default ``anabranch``; ``source``: ``file.py:name``); its id at once. Then ``wait``."""
        return await _queued.submit(self, definition, task, queue=queue, source=source)

    async def wait(
        self,
        session_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - ends with a clear error (CLI --timeout)
    ) -> RunResult:
        """The result of a session once it has ended, whoever runs it (polls the store).
        Raises ``SessionNotFoundError``, or ``UserError`` when not ended in ``timeout``."""
        return await _queued.wait(self, session_id, timeout)

    def defines(self, session: SessionRecord) -> bool:
        """Whether this runtime was given the session's entry agent (or graph) by name."""
        return _queued.defines(self, session)

    def resolve_agent(self, session: SessionRecord, agent: Agent | None = None) -> Agent:
        """The root agent of a session: given, registered, or loaded from its source."""
        return resolve_agent(session, agent, self._agents, self.register)

    async def rewind(self, session_id: str, run_id: str, boundary_id: int) -> BoundaryRecord:
        """Restore a run's context to what it was before boundary ``boundary_id``.

        The rewind is a new boundary (a new branch); nothing is deleted, so the context
        that was left stays readable. Resume the session to continue from it.

        Raises:
            UserError: unknown run or boundary; SessionBusyError: the session is running.
        """
        async with self._driver.lease(session_id):
            return await rewind_run(self.store, session_id, run_id, boundary_id)

    # ------------------------------------------------------------------ reporting
    async def session_usage(self, session_id: str, run_id: str | None = None) -> Usage:
        """Tokens paid in the session (or one run): agent calls plus summarizer calls."""
        return await session_usage(self.store, session_id, run_id)
