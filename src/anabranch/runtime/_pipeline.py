"""The context pipeline hook: what runs before each model call (compaction lives behind it)."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from anabranch.errors import PromptTooLongError
from anabranch.messages import ToolUseBlock
from anabranch.runtime._builtins import ToolOutcome

__all__ = ["ContextPipeline", "PassThroughPipeline"]

RunT = TypeVar("RunT", contravariant=True)


class ContextPipeline(Protocol[RunT]):
    """Keeps one run's context inside its window.

    Generic over the run it is given (the loop passes its ``AgentRun``), so this seam does
    not import the loop back; issue 13 turns it into a view in, change out hook.
    """

    async def ingest(self, run: RunT, call: ToolUseBlock, outcome: ToolOutcome) -> ToolOutcome:
        """The version of a tool result that enters the context (e.g. a preview + handle).

        Must be deterministic: it runs again on resume for results already stored.
        """
        ...

    async def before_call(self, run: RunT) -> None:
        """Runs before every model call; may compact ``run``'s context."""
        ...

    async def on_prompt_too_long(self, run: RunT, error: PromptTooLongError, attempt: int) -> bool:
        """React to a prompt-too-long answer; True if the request should be rebuilt and sent."""
        ...


class PassThroughPipeline:
    """No budgets, no compaction: the context grows until the API refuses it (a
    ``ContextPipeline`` of any run)."""

    async def ingest(self, run: Any, call: ToolUseBlock, outcome: ToolOutcome) -> ToolOutcome:
        return outcome

    async def before_call(self, run: Any) -> None:
        return None

    async def on_prompt_too_long(self, run: Any, error: PromptTooLongError, attempt: int) -> bool:
        return False
