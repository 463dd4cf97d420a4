"""What a runtime is made of when the caller does not say (built-in tools, the context
pipeline), how a session records its definition, and how a session's agent is found again."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from anabranch.agents import Agent, Graph
from anabranch.errors import UserError
from anabranch.models._base import Model
from anabranch.runtime._builtins import BuiltinTool
from anabranch.runtime._compactor import CompactingPipeline
from anabranch.runtime._loader import resolve_recorded
from anabranch.runtime._memory import ForgetTool, LogTool, RememberTool
from anabranch.runtime._pipeline import ContextPipeline
from anabranch.runtime._recall import RecallTool
from anabranch.runtime._spawn import SpawnTool
from anabranch.store import SessionRecord

__all__ = [
    "MODEL_CLIENT_KEY",
    "agent_outline",
    "client_name",
    "default_builtins",
    "default_pipeline",
    "resolve_agent",
]


def default_builtins() -> tuple[BuiltinTool, ...]:
    """The built-in tools every runtime offers (to the agents they apply to)."""
    return (SpawnTool(), RecallTool(), RememberTool(), ForgetTool(), LogTool())


def default_pipeline() -> ContextPipeline:
    """The context pipeline used when none is given: budgets, clearing, compaction."""
    return CompactingPipeline()


MODEL_CLIENT_KEY = "model_client"
"""The key of the model client's class in a session's definition outline (``show`` tells a
test model's figures from priced ones)."""


def client_name(model: Model) -> str:
    return f"{type(model).__module__}.{type(model).__qualname__}"


def agent_outline(agent: Agent) -> dict[str, Any]:
    return {
        "name": agent.name,
        "model": agent.model,
        "window": agent.context.window,
        "threshold": agent.context.threshold,
        "tools": [t.name for t in agent.tools],
        "subagents": [agent_outline(a) for a in agent.subagents],
        **({"budget": agent.budget.model_dump(mode="json")} if agent.budget else {}),
    }


def resolve_agent(
    session: SessionRecord,
    agent: Agent | None,
    registered: Mapping[str, Agent],
    register: Callable[[Agent | Graph], None],
) -> Agent:
    """The root agent of a session: ``agent`` if given (it must have the session's entry
    name), else the registered one, else the one its recorded source file defines (only if
    that file is unchanged since the session started)."""
    if agent is not None:
        if agent.name != session.entry:
            raise UserError(
                f"session {session.id} was run by agent {session.entry!r}, not {agent.name!r}"
            )
        return agent
    return resolve_recorded(
        session,
        Agent,
        registered,
        register,
        hint="pass it to resume(session_id, agent=...) or Runtime(agents=[...])",
    )
