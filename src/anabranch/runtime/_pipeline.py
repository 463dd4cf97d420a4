"""The context pipeline hook: what runs before each model call (compaction lives behind it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from anabranch.errors import PromptTooLongError
from anabranch.messages import ToolUseBlock
from anabranch.runtime._builtins import ToolOutcome

if TYPE_CHECKING:
    from anabranch.runtime._loop import AgentRun

__all__ = ["ContextPipeline", "PassThroughPipeline"]


class ContextPipeline(Protocol):
    """Keeps one run's context inside its window."""

    async def ingest(self, run: AgentRun, call: ToolUseBlock, outcome: ToolOutcome) -> ToolOutcome:
        """The version of a tool result that enters the context (e.g. a preview + handle).

        Must be deterministic: it runs again on resume for results already stored.
        """
        ...

    async def before_call(self, run: AgentRun) -> None:
        """Runs before every model call; may compact ``run``'s context."""
        ...

    async def on_prompt_too_long(
        self, run: AgentRun, error: PromptTooLongError, attempt: int
    ) -> bool:
        """React to a prompt-too-long answer; True if the request should be rebuilt and sent."""
        ...


class PassThroughPipeline:
    """No budgets, no compaction: the context grows until the API refuses it."""

    async def ingest(self, run: AgentRun, call: ToolUseBlock, outcome: ToolOutcome) -> ToolOutcome:
        return outcome

    async def before_call(self, run: AgentRun) -> None:
        return None

    async def on_prompt_too_long(
        self, run: AgentRun, error: PromptTooLongError, attempt: int
    ) -> bool:
        return False
