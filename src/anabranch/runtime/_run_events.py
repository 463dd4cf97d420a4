"""``RunEvents``: what one agent run tells the event bus (nothing when nobody listens).

The loop calls these at its emission points; each builds a typed event with the run's
identity (session, run, agent, parent run) and publishes it without waiting.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Literal

import anyio

from anabranch import events as ev
from anabranch.context._pricing import PriceTable
from anabranch.errors import ApprovalPendingError, ModelError
from anabranch.messages import ModelRequest, ModelResponse, ToolUseBlock
from anabranch.runtime._events import EventBus
from anabranch.runtime._view import RunView

if TYPE_CHECKING:
    from anabranch.runtime._builtins import ToolOutcome
    from anabranch.runtime._cache_watch import CacheBreak

__all__ = ["RunEvents", "run_status_for"]

_PRICES = PriceTable()

COMPACTION_KINDS = ("compaction", "clear")

_NOTHING_TO_REPORT: AbstractAsyncContextManager[None] = nullcontext()


def run_status_for(error: BaseException) -> Literal["failed", "cancelled", "stopped", "waiting"]:
    """How a run that raised ``error`` stands: ``stopped`` runs are resumable as they are."""
    if isinstance(error, anyio.get_cancelled_exc_class()):
        return "cancelled"
    if isinstance(error, ApprovalPendingError):
        return "waiting"
    if isinstance(error, ModelError):
        return "stopped"
    return "failed"


class RunEvents:
    """The event side of one agent run (read through its ``RunView``)."""

    def __init__(self, run: RunView, bus: EventBus) -> None:
        # weak: the run holds its events, so a strong reference back would make every
        # finished run (its whole context) garbage only the cyclic collector can free
        self._run_ref = weakref.ref(run)
        self._bus = bus
        self._compaction_announced = False

    @property
    def _run(self) -> RunView:
        run = self._run_ref()
        if run is None:  # pragma: no cover - the run owns its events
            raise RuntimeError("the run of these events is gone")
        return run

    @property
    def active(self) -> bool:
        return self._bus.active

    def emit(self, event_type: type[ev.Event], **fields: Any) -> None:
        """Publish one event of this run, if anyone listens."""
        run = self._run
        bus = self._bus
        if not bus.active:
            return
        bus.publish(
            event_type(
                session_id=run.session_id,
                run_id=run.id,
                agent=run.agent.name,
                parent_run_id=run.record.parent_run_id,
                time=time.time(),
                **fields,
            )
        )

    def delta(self, kind: Literal["text", "thinking"], text: str) -> None:
        if text:
            self.emit(ev.TextDelta if kind == "text" else ev.ThinkingDelta, text=text)

    # ------------------------------------------------------------------ lifecycle
    def run_started(self) -> None:
        """``run_started``, as the run is driven (the loop then calls ``run_done`` or
        ``run_failed``)."""
        if not self._bus.active:
            return
        run = self._run
        self.emit(
            ev.RunStarted,
            depth=run.record.depth,
            mode=run.record.mode,
            turns=run.turns,
            window=run.agent.context.window,
            threshold=run.threshold,
        )

    def run_failed(self, error: BaseException) -> None:
        """``run_finished`` with the cause of a run that raised ``error``."""
        self.emit(
            ev.RunFinished,
            status=run_status_for(error),
            error=f"{type(error).__name__}: {error}",
            turns=self._run.turns,
        )

    def run_done(self, output: str, stop_reason: str | None = None) -> None:
        """``run_finished``; ``stop_reason`` when a limit ended the run with its report."""
        if not self._bus.active:
            return
        self.emit(
            ev.RunFinished,
            status="done",
            output=output,
            turns=self._run.turns,
            stop_reason=stop_reason,
        )

    # ------------------------------------------------------------------ model calls
    def call_started(self, request: ModelRequest, attempt: int, purpose: str | None) -> None:
        if not self._bus.active:  # (once per model call: no property in between)
            return
        run = self._run
        if purpose == "compaction" and not self._compaction_announced:
            self._compaction_announced = True
            self.emit(
                ev.CompactionStarted,
                tokens_before=run.context_tokens,
                messages_before=len(run.context),
            )
        self.emit(
            ev.ModelCallStarted,
            turn=run.turns + 1,
            attempt=attempt,
            purpose=purpose,
            context_tokens=run.context_tokens if purpose is None else 0,
            window=run.agent.context.window,
            threshold=run.threshold,
        )

    def call_finished(self, attempt: int, purpose: str | None, response: ModelResponse) -> None:
        if not self._bus.active:  # (once per model call: no property in between)
            return
        cost = _PRICES.cost(response.model or self._run.agent.model, response.usage)
        self.emit(
            ev.ModelCallFinished,
            turn=self._run.turns + 1,
            attempt=attempt,
            purpose=purpose,
            usage=response.usage,
            stop_reason=response.stop_reason,
            cost=cost.total if cost is not None else None,
        )

    def call_failed(self, attempt: int, purpose: str | None, error: ModelError) -> None:
        self.emit(
            ev.ModelCallFinished,
            turn=self._run.turns + 1,
            attempt=attempt,
            purpose=purpose,
            ok=False,
            error=f"{type(error).__name__}: {error}",
        )

    def retry_scheduled(self, error: ModelError, delay: float, attempt: int) -> None:
        """A model call's retry: traced on the current span, then announced."""
        self._run.tracing.retry_scheduled(error, delay, attempt)
        self.emit(
            ev.Retry,
            attempt=attempt,
            error=str(error),
            error_type=type(error).__name__,
            delay=delay,
        )

    def cache_break(self, found: CacheBreak | None) -> None:
        if found is not None:
            self.emit(
                ev.CacheBreakEvent,
                cause=found.cause,
                expected_read=found.expected_read,
                actual_read=found.actual_read,
            )

    # ------------------------------------------------------------------ tools
    def tool_started(self, use: ToolUseBlock) -> None:
        if not self._bus.active:  # the event's fields are not even gathered
            return
        self.emit(ev.ToolCallStarted, call_id=use.id, tool=use.name, arguments=use.input)

    def tool_finished(self, use: ToolUseBlock, outcome: ToolOutcome) -> None:
        if not self._bus.active:
            return
        self.emit(
            ev.ToolCallFinished,
            call_id=use.id,
            tool=use.name,
            is_error=outcome.is_error,
            chars=len(outcome.content),
        )

    # ------------------------------------------------------------------ compaction
    def compactions(self) -> AbstractAsyncContextManager[None]:
        """Around a pipeline step: the compactions it committed, as events.

        A summarizing compaction announces ``compaction_started`` when its summarizer
        call begins; one that needs no model call announces it with its result. Nothing
        (one shared no-op) when nobody listens: this wraps every model call.
        """
        return self._reported_compactions() if self.active else _NOTHING_TO_REPORT

    @asynccontextmanager
    async def _reported_compactions(self) -> AsyncIterator[None]:
        run = self._run
        started, before = time.time(), run.compactions
        self._compaction_announced = False
        try:
            yield
        finally:
            if run.compactions != before or self._compaction_announced:
                with anyio.CancelScope(shield=True):
                    await self._report_boundaries(started)
            self._compaction_announced = False

    async def _report_boundaries(self, since: float) -> None:
        run = self._run
        announced = self._compaction_announced
        boundaries = await run.store.list_boundaries(run_id=run.id)
        for boundary in boundaries:
            if boundary.created < since or boundary.kind not in COMPACTION_KINDS:
                continue
            if not (announced and boundary.kind == "compaction"):
                self.emit(
                    ev.CompactionStarted,
                    tokens_before=boundary.tokens_before or 0,
                    messages_before=boundary.messages_before or 0,
                )
            announced = announced and boundary.kind != "compaction"
            self.emit(
                ev.CompactionFinished,
                boundary_id=boundary.id,
                boundary_kind=boundary.kind,
                strategy=boundary.strategy,
                trigger=boundary.trigger,
                status=boundary.status,
                tokens_before=boundary.tokens_before,
                tokens_after=boundary.tokens_after,
                messages_before=boundary.messages_before,
                messages_after=boundary.messages_after,
                error=boundary.error,
            )
