"""Built-in tools the runtime offers an agent (``spawn_agent``, ``recall``, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from anabranch.agents import Agent
from anabranch.agents._tools import Pin
from anabranch.messages import Document, Image, ToolDefinition, ToolUseBlock, valid_text
from anabranch.runtime._view import RunView

__all__ = ["BuiltinTool", "ToolOutcome"]


@dataclass(frozen=True)
class ToolOutcome:
    """What a tool call returns to the model."""

    content: str
    is_error: bool = False
    attachments: tuple[Image | Document, ...] = ()
    """Images and documents the tool returned, after its text."""
    pins: tuple[Pin, ...] = ()
    """What the call pinned (``ToolContext.pin``), committed with its result."""

    def __post_init__(self) -> None:
        # whatever a tool hands back (a file name from os.listdir, say) is stored and sent
        object.__setattr__(self, "content", valid_text(self.content))


class BuiltinTool(Protocol):
    """A tool implemented by the runtime itself, with access to the calling run.

    A built-in may set a class attribute ``clearable = False`` (as ``@tool(clearable=...)``)
    so that clearing never stubs its results; without one, its results are clearable.
    """

    name: str

    def applies_to(self, agent: Agent) -> bool:
        """Whether ``agent`` is offered this tool."""
        ...

    def definition(self, agent: Agent) -> ToolDefinition: ...

    async def run(self, run: RunView, call: ToolUseBlock) -> ToolOutcome:
        """Answer ``call`` for ``run`` (read-only: return the outcome, assign nothing)."""
        ...
