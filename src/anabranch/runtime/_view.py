"""``RunView``: the narrow, read-only view of one agent run that extensions receive.

Built-in tools (``BuiltinTool.run``), the cache-break check, memory tools and the event
emitter see a run only through this protocol: its identity, definition, prompt snapshot,
committed context and counters, and the store and tracing it runs with. Every member is a
read-only property, so nothing typed against it can assign run state: only the loop
(``AgentRun``) changes a run. The loop's ``AgentRun`` implements it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from anabranch.agents import Agent
from anabranch.messages import Message, SystemBlock, ToolDefinition
from anabranch.store import RunRecord, Store
from anabranch.traces import Tracing

__all__ = ["RunView"]


class RunView(Protocol):
    """What an extension may read of a run (never assign)."""

    @property
    def id(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def agent(self) -> Agent: ...
    @property
    def record(self) -> RunRecord:
        """The run's committed record (parent, depth, mode)."""
        ...

    @property
    def store(self) -> Store: ...
    @property
    def tracing(self) -> Tracing: ...
    @property
    def system(self) -> tuple[SystemBlock, ...]:
        """The system blocks of the current prompt snapshot."""
        ...

    @property
    def tools(self) -> tuple[ToolDefinition, ...]:
        """The tool definitions of the current prompt snapshot."""
        ...

    @property
    def context(self) -> Sequence[Message]:
        """The context the next request is built from."""
        ...

    @property
    def turns(self) -> int: ...
    @property
    def next_seq(self) -> int:
        """The seq the next committed message gets."""
        ...

    @property
    def compactions(self) -> int: ...
    @property
    def context_tokens(self) -> int: ...
    @property
    def threshold(self) -> int: ...
