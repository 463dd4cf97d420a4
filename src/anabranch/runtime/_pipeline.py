"""The context pipeline hook: what runs before each model call (compaction lives behind it).

A pipeline reads a run through ``ContextView`` and returns a ``ContextChange`` (or ``None``:
nothing to do); the loop commits it (see ``runtime._context_view``).
"""

from __future__ import annotations

from typing import Protocol

from anabranch.errors import PromptTooLongError
from anabranch.messages import ToolUseBlock
from anabranch.runtime._builtins import ToolOutcome
from anabranch.runtime._context_view import ContextChange, ContextView, Ingested

__all__ = ["ContextPipeline", "PassThroughPipeline"]


class ContextPipeline(Protocol):
    """Keeps one run's context inside its window: a view in, a change out."""

    async def ingest(self, run: ContextView, call: ToolUseBlock, outcome: ToolOutcome) -> Ingested:
        """The version of a tool result that enters the context (e.g. a preview + handle),
        and the spills the loop saves before it commits the result.

        Must be deterministic: it runs again on resume for results already stored.
        """
        ...

    async def before_call(self, run: ContextView) -> ContextChange | None:
        """Runs before every model call; what to change in ``run``'s context, if anything."""
        ...

    async def on_prompt_too_long(
        self, run: ContextView, error: PromptTooLongError, attempt: int
    ) -> ContextChange | None:
        """React to a prompt-too-long answer: the request is rebuilt and sent again if the
        change returned applied (made the context smaller)."""
        ...


class PassThroughPipeline:
    """No budgets, no compaction: the context grows until the API refuses it."""

    async def ingest(self, run: ContextView, call: ToolUseBlock, outcome: ToolOutcome) -> Ingested:
        return Ingested(outcome)

    async def before_call(self, run: ContextView) -> ContextChange | None:
        return None

    async def on_prompt_too_long(
        self, run: ContextView, error: PromptTooLongError, attempt: int
    ) -> ContextChange | None:
        return None
