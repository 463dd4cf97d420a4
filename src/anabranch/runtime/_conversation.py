"""Conversations: a finished session's next turn (``send``), its events (``stream``) and
a compaction on request (``compact``), all in the root agent's one context."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from anabranch.agents import Agent
from anabranch.errors import SessionNotFoundError, UserError
from anabranch.runtime._event_stream import EventStream, open_stream
from anabranch.runtime._loop import AgentRun
from anabranch.runtime._session_view import root_run
from anabranch.store import RunRecord, SessionRecord

if TYPE_CHECKING:
    from anabranch.runtime._compactor import CompactionOutcome
    from anabranch.runtime._results import RunResult
    from anabranch.runtime._runtime import Runtime

__all__ = ["compact_session", "send_message", "stream_session"]

_EITHER = "stream() takes either (agent, task) or (session_id=, message=)"


async def _finished_root(
    rt: Runtime, session_id: str, agent: Agent | None
) -> tuple[SessionRecord, Agent, RunRecord]:
    """The session, its root agent and its root run, which must have finished well."""
    session = await rt.store.get_session(session_id)
    if session is None:
        raise SessionNotFoundError(session_id)
    if session.kind != "agent":
        raise UserError(f"session {session_id} is a {session.kind} session, not an agent's")
    root_agent = rt.resolve_agent(session, agent)
    root = await root_run(rt.store, session_id)
    if root is None or root.status == "running":
        raise UserError(
            f"session {session_id} has an unfinished turn: resume it first "
            f"(anabranch resume {session_id})"
        )
    if root.status != "done":
        raise UserError(f"session {session_id} failed ({root.error}); it cannot continue")
    return session, root_agent, root


async def send_message(
    rt: Runtime, session_id: str, message: str, agent: Agent | None = None
) -> RunResult:
    """See ``Runtime.send``."""
    if not isinstance(message, str) or not message.strip():
        raise UserError("the message must be a non-empty string")
    _, root_agent, root = await _finished_root(rt, session_id, agent)
    env = rt.environment(session_id)

    async def load_and_continue() -> AgentRun:
        run = await AgentRun.load(env, root_agent, root)
        await run.continue_with(message)
        return run

    # the agent-session driver of the runtime (lease, status, events, the result)
    return await rt._drive_agent(session_id, root_agent.name, load_and_continue, task=message)


async def compact_session(
    rt: Runtime, session_id: str, agent: Agent | None = None
) -> CompactionOutcome:
    """See ``Runtime.compact``."""
    from anabranch.runtime._compactor import CompactingPipeline, CompactionOutcome

    _, root_agent, root = await _finished_root(rt, session_id, agent)
    pipeline = rt.pipeline
    if not isinstance(pipeline, CompactingPipeline):
        return CompactionOutcome(applied=False, failure="this runtime's pipeline does not compact")
    async with rt._driver.lease(session_id):
        run = await AgentRun.load(rt.environment(session_id), root_agent, root)
        async with run.events.compactions():
            return await pipeline.compact(run, trigger="manual")


def stream_session(
    rt: Runtime,
    agent: Agent | None,
    task: str | None,
    session_id: str | None,
    message: str | None,
    source: str | None,
) -> AbstractAsyncContextManager[EventStream]:
    """See ``Runtime.stream``."""
    if agent is not None or task is not None:
        if session_id is not None or message is not None:
            raise UserError(_EITHER)
        if not isinstance(agent, Agent):
            raise UserError(f"stream() needs an Agent, got {type(agent).__name__}")
        chosen_agent, chosen_task = agent, task

        async def drive(on_session: Callable[[str], None]) -> RunResult:
            if not isinstance(chosen_task, str):
                raise UserError("the task must be a non-empty string")
            return await rt.run(chosen_agent, chosen_task, source=source, on_session=on_session)

        return open_stream(rt.events, drive)
    if session_id is None or message is None:
        raise UserError(_EITHER)
    known_session, text = session_id, message

    async def send(on_session: Callable[[str], None]) -> RunResult:
        on_session(known_session)
        return await rt.send(known_session, text)

    return open_stream(rt.events, send)
