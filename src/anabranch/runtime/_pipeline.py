"""The context pipeline hook: what runs before each model call (compaction lives behind it).

A pipeline reads a run through ``ContextView`` and returns a ``ContextChange`` (or ``None``:
nothing to do); the loop commits it (see ``runtime._context_view``). A pipeline whose
``ingest`` never awaits also offers it as a plain function, ``ingest_now`` (``IngestsNow``):
then the loop commits a turn's last tool result and the results message in one transaction,
in the step in which the tool returned (see ``runtime._tool_calls``). A pipeline that
says which agents' runs it may start work ahead for (``works_ahead``, ``WorksAhead``)
spares every other run the task group ``ContextView.background`` would hold. A pipeline
that can tell without an await that ``before_call`` has nothing to do (``QuietBeforeCall``)
lets the loop commit a tool turn's last result, the results message and the next call's
row in one transaction (see ``runtime._tool_calls``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from types import FunctionType
from typing import Any, Protocol

from anabranch.agents import Agent
from anabranch.context._budget import preview, spill_handle
from anabranch.errors import PromptTooLongError
from anabranch.messages import ToolUseBlock
from anabranch.runtime._builtins import ToolOutcome
from anabranch.runtime._context_view import ContextChange, ContextView, Ingested, SpillWrite

__all__ = [
    "ContextPipeline",
    "IngestsNow",
    "PassThroughPipeline",
    "QuietBeforeCall",
    "WorksAhead",
    "plain_twin",
    "spill_over_limit",
]


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


class IngestsNow(Protocol):
    """A pipeline whose ``ingest`` is a plain function of its arguments (no await)."""

    def ingest_now(self, run: ContextView, call: ToolUseBlock, outcome: ToolOutcome) -> Ingested:
        """What ``ingest`` returns, computed without an await."""
        ...


class QuietBeforeCall(Protocol):
    """A pipeline that can tell, without an await, that ``before_call`` has nothing to do."""

    def quiet_before_call(self, run: ContextView) -> bool:
        """``True`` only if ``before_call(run)`` would return ``None`` having awaited,
        started and changed nothing: the loop then does not call it for the next call."""
        ...


class WorksAhead(Protocol):
    """A pipeline that says whether it may start background work for an agent's runs."""

    def works_ahead(self, agent: Agent) -> bool:
        """Whether runs of ``agent`` may start work in ``ContextView.background``; for the
        others the loop opens no task group (their ``background`` is ``None``)."""
        ...


_PAIRED: dict[tuple[type, str], bool] = {}


def plain_twin(pipeline: object, method: str, twin: str) -> Callable[..., Any] | None:
    """``pipeline``'s ``twin`` (a plain function standing for its async ``method``:
    ``ingest_now``, ``quiet_before_call``), if the class that last defines either defines
    both: a subclass that overrides ``method`` alone does not inherit a twin that no
    longer speaks for it.

    Called with the pipeline first (``twin(pipeline, *arguments)``): the class's own
    function, one object for every run of every session (a bound method would be one
    per run, kept as long as the run)."""
    cls = type(pipeline)
    paired = _PAIRED.get((cls, twin))
    if paired is None:
        owner = next((k for k in cls.__mro__ if method in vars(k) or twin in vars(k)), None)
        paired = owner is not None and method in vars(owner) and twin in vars(owner)
        _PAIRED[(cls, twin)] = paired
    if not paired:
        return None
    function = next(vars(k)[twin] for k in cls.__mro__ if twin in vars(k))
    if isinstance(function, FunctionType) and twin not in getattr(pipeline, "__dict__", ()):
        return function
    return partial(_call_twin, twin)  # (a static method, an instance's own value...)


def _call_twin(twin: str, pipeline: object, *arguments: Any) -> Any:
    """``pipeline``'s ``twin`` called as ``getattr`` finds it."""
    return getattr(pipeline, twin)(*arguments)


def spill_over_limit(run: ContextView, call: ToolUseBlock, outcome: ToolOutcome) -> Ingested:
    """A result over the run's spill limit enters the context as a preview ending in its
    recall handle, its whole text spilled; any other result enters as it is (images and
    documents stay whole)."""
    policy = run.agent.context
    max_chars = policy.spill_chars
    if len(outcome.content) <= max_chars:
        return Ingested(outcome)  # it fits (what ``preview`` would say): no handle to derive
    handle = spill_handle(run.id, call.id)
    text = preview(
        outcome.content,
        is_error=outcome.is_error,
        max_chars=max_chars,
        preview_chars=policy.preview_chars,
        handle=handle,
    )
    if text is None:
        return Ingested(outcome)
    spill = SpillWrite(handle, call.id, outcome.content)
    return Ingested(replace(outcome, content=text), (spill,))


class PassThroughPipeline:
    """No budgets, no compaction: the context grows until the API refuses it."""

    async def ingest(self, run: ContextView, call: ToolUseBlock, outcome: ToolOutcome) -> Ingested:
        return Ingested(outcome)

    def ingest_now(self, run: ContextView, call: ToolUseBlock, outcome: ToolOutcome) -> Ingested:
        return Ingested(outcome)

    async def before_call(self, run: ContextView) -> ContextChange | None:
        return None

    def quiet_before_call(self, run: ContextView) -> bool:
        return True

    async def on_prompt_too_long(
        self, run: ContextView, error: PromptTooLongError, attempt: int
    ) -> ContextChange | None:
        return None

    def works_ahead(self, agent: Agent) -> bool:
        return False
