"""Conversations: what ``Runtime.send``, ``compact`` and ``stream`` check and build before
the session driver takes over (kept apart from ``Runtime`` so it stays small)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Protocol

from anabranch.agents import Agent
from anabranch.errors import SessionNotFoundError, UserError
from anabranch.runtime._compactor import CompactingPipeline, CompactionOutcome
from anabranch.runtime._environment import Environment
from anabranch.runtime._event_stream import EventStream, open_stream
from anabranch.runtime._events import EventBus
from anabranch.runtime._loop import AgentRun
from anabranch.runtime._results import RunResult
from anabranch.runtime._session_view import root_run
from anabranch.store import RunRecord, SessionRecord, Store

__all__ = ["check_message", "compact_finished", "finished_root", "stream_session"]

_EITHER = "stream() takes either (agent, task) or (session_id=, message=)"


def check_message(message: object) -> str:
    if not isinstance(message, str) or not message.strip():
        raise UserError("the message must be a non-empty string")
    return message


async def finished_root(
    store: Store, session_id: str, resolve: Callable[[SessionRecord], Agent]
) -> tuple[Agent, RunRecord]:
    """The root agent and root run of an agent session whose last turn finished well."""
    session = await store.get_session(session_id)
    if session is None:
        raise SessionNotFoundError(session_id)
    if session.kind != "agent":
        raise UserError(f"session {session_id} is a {session.kind} session, not an agent's")
    root_agent = resolve(session)
    root = await root_run(store, session_id)
    if root is None or root.status == "running":
        raise UserError(
            f"session {session_id} has an unfinished turn: resume it first "
            f"(anabranch resume {session_id})"
        )
    if root.status not in ("done", "incomplete"):  # a limit's report may be continued
        raise UserError(f"session {session_id} failed ({root.error}); it cannot continue")
    return root_agent, root


def stream_session(
    bus: EventBus,
    run: Callable[[Agent, str, Callable[[str], None]], Awaitable[RunResult]],
    send: Callable[[str, str], Awaitable[RunResult]],
    agent: Agent | None,
    task: str | None,
    session_id: str | None,
    message: str | None,
) -> AbstractAsyncContextManager[EventStream]:
    """See ``Runtime.stream``: ``run(agent, task, on_session)`` or ``send(id, message)``."""
    if agent is not None or task is not None:
        if session_id is not None or message is not None:
            raise UserError(_EITHER)
        if not isinstance(agent, Agent):
            raise UserError(f"stream() needs an Agent, got {type(agent).__name__}")
        chosen_agent, chosen_task = agent, task

        async def drive(on_session: Callable[[str], None]) -> RunResult:
            if not isinstance(chosen_task, str):
                raise UserError("the task must be a non-empty string")
            return await run(chosen_agent, chosen_task, on_session)

        return open_stream(bus, drive)
    if session_id is None or message is None:
        raise UserError(_EITHER)
    known_session, text = session_id, message

    async def continue_session(on_session: Callable[[str], None]) -> RunResult:
        on_session(known_session)
        return await send(known_session, text)

    return open_stream(bus, continue_session)


class CompactingHost(Protocol):
    """What compacting a finished turn needs of a ``Runtime``."""

    @property
    def store(self) -> Store: ...
    @property
    def pipeline(self) -> object: ...
    def resolve_agent(self, session: SessionRecord, agent: Agent | None = None) -> Agent: ...
    def environment(self, session_id: str) -> Environment: ...


async def compact_finished(
    rt: CompactingHost,
    lease: Callable[[str], AbstractAsyncContextManager[None]],
    session_id: str,
    agent: Agent | None,
    *,
    trigger: str,
) -> CompactionOutcome:
    """Compact the root agent's context of a finished turn now, under the session's
    ``lease`` (``Runtime.compact``: ``manual``; ``IdleCompactor``: ``idle``)."""
    root_agent, root = await finished_root(
        rt.store, session_id, lambda session: rt.resolve_agent(session, agent)
    )
    pipeline = rt.pipeline
    if not isinstance(pipeline, CompactingPipeline):
        return CompactionOutcome(applied=False, failure="this pipeline cannot compact")
    async with lease(session_id):
        run = await AgentRun.load(rt.environment(session_id), root_agent, root)
        async with run.events.compactions():
            return await run.pipeline_step(partial(pipeline.compact, trigger=trigger))
