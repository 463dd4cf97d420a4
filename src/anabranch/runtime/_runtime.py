"""``Runtime``: opens the store and runs, resumes and reports sessions.

``Runtime`` owns the store, the model client it created and the session driver; its verbs
that open, run and continue sessions (``open_session``, ``run``, ``run_graph``, ``resume``,
``send``) are functions of it in ``_runtime_sessions``, bound as its methods."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from opentelemetry import trace

from anabranch.agents import Agent, Budget, Graph
from anabranch.context._pricing import PriceTable
from anabranch.errors import SessionNotFoundError, UserError
from anabranch.messages import Usage
from anabranch.models._base import Model
from anabranch.models._retry import RetryPolicy
from anabranch.runtime import _queued
from anabranch.runtime._approval import PendingApproval, decide, pending_approvals
from anabranch.runtime._budgets import (
    check_tenant_budgets,
    open_limits,
)
from anabranch.runtime._builtins import BuiltinTool
from anabranch.runtime._compactor import CompactionOutcome
from anabranch.runtime._conversation import (
    compact_finished,
    stream_session,
)
from anabranch.runtime._dbpath import database_path
from anabranch.runtime._definitions import (
    default_builtins,
    default_pipeline,
    resolve_agent,
)
from anabranch.runtime._environment import Environment
from anabranch.runtime._event_stream import EventStream
from anabranch.runtime._events import EventBus, EventCallback
from anabranch.runtime._pipeline import ContextPipeline
from anabranch.runtime._results import RunResult, session_usage
from anabranch.runtime._rewind import rewind_run
from anabranch.runtime._run_limits import SessionLimits
from anabranch.runtime._runtime_sessions import open_session, resume, run, run_graph, send
from anabranch.runtime._session import SessionDriver
from anabranch.runtime._spawn import SpawnLimits
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

    def register(self, *definitions: Agent | Graph) -> None:
        """Make agents (and graphs) resumable by name in this process."""
        for definition in definitions:
            if isinstance(definition, Graph):
                self.graphs[definition.name] = definition
            else:
                self._agents[definition.name] = definition

    # ------------------------------------------------------------------ running
    # new and continued sessions: functions of a ``Runtime`` in ``_runtime_sessions``
    open_session = open_session
    run = run
    run_graph = run_graph
    resume = resume
    send = send

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
