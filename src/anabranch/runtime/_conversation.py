"""Conversations: what ``Runtime.send``, ``compact`` and ``stream`` check and build before
the session driver takes over (kept apart from ``Runtime`` so it stays small)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

from anabranch.agents import Agent
from anabranch.errors import SessionNotFoundError, UserError
from anabranch.runtime._event_stream import EventStream, open_stream
from anabranch.runtime._events import EventBus
from anabranch.runtime._results import RunResult
from anabranch.runtime._session_view import root_run
from anabranch.store import RunRecord, SessionRecord, Store

__all__ = ["check_message", "finished_root", "stream_session"]

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
