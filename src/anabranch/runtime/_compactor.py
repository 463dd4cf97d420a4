"""``CompactingPipeline``: keeps each agent run inside its own window, losing nothing.

Before every model call, for the run about to call (each run has its own policy):

1. (at ingest) a tool result over ``tool_result_max_chars`` is spilled to the store and
   the context gets a preview ending in ``recall id=<handle>``;
2. above the soft threshold (``clear_at``), tool results older than the last
   ``clear_tool_results_after`` become one-line stubs with their handle;
3. above the threshold, the context is compacted with the policy's strategy (``server``:
   the API writes the summary, see ``_server_compaction``);
4. on ``prompt is too long``, it is compacted again keeping fewer messages, then retried;
5. after ``max_compaction_failures`` failures in a row the breaker opens (``_breaker``):
   the run fails (``on_compaction_failure="fail"``) or goes on with the ``window``
   strategy, which needs no model (``"continue"``), until the breaker is half-open again.

**No silent loss.** Content leaves a context only after a summarizer request contained it
(a range over the summarizer's budget is summarized in parts, see ``_summarizer``), or in
an explicit note that names it and its recall handles (``window``, ``verbatim``, stubs).
Cleared results are restored from their spills before a summary, so the summarizer reads
originals, not stubs. Every boundary records a loss manifest (``context.digest``).

Every change is a boundary row (see ``context.layout``); the original messages are never
touched, and ``recall`` reaches all of them.

**A view in, a change out.** The pipeline reads the run through ``ContextView`` and
returns a ``ContextChange`` (boundaries with their rows, spills and the context they leave);
the loop commits it. Within one step, later decisions see the earlier ones through a
``CompactionStep`` (see ``runtime._compaction_step``).

This module decides when and what (clearing, compaction attempts, the breaker); the new
context of an attempt is built in ``_compaction_rebuild``, and the summary is asked for in
``_summary_calls``.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

from opentelemetry.trace import Span

from anabranch.agents import Agent
from anabranch.context._compaction import cleared_context
from anabranch.context._tokens import estimate_messages
from anabranch.errors import PromptTooLongError
from anabranch.messages import ToolUseBlock
from anabranch.runtime._ahead import AheadSummaries, Ready, ahead_split
from anabranch.runtime._breaker import (
    breaker_open,
    breaker_record,
    breaker_state,
    breaker_verdict,
    consecutive_failures,
    failure_record,
    warn_too_small,
)
from anabranch.runtime._builtins import ToolOutcome
from anabranch.runtime._compaction_rebuild import (
    CompactionError,
    frees_too_little,
    rebuild,
    tail_budget,
)
from anabranch.runtime._compaction_step import CompactionStep, boundary_commit, manifest_of
from anabranch.runtime._context_view import (
    CompactionOutcome,
    ContextChange,
    ContextView,
    Ingested,
)
from anabranch.runtime._limits import ChannelLimits
from anabranch.runtime._model_switch import ModelSwitch, model_switch, same_model
from anabranch.runtime._pipeline import spill_over_limit
from anabranch.runtime._quiet_call import quiet_before_call
from anabranch.runtime._summarizer import SummarizerFailed
from anabranch.runtime._summary_calls import fixed_tokens, pre_compact_hook, summarize_head

__all__ = ["CompactingPipeline", "CompactionOutcome", "breaker_open", "consecutive_failures"]

_log = logging.getLogger("anabranch.compaction")

MIN_CLEAR_FRACTION = 0.05
"""Clearing must free at least this fraction of the window, so the cache is not broken
for a few tokens at every turn."""


class CompactingPipeline:
    """The default ``ContextPipeline`` (see the module docstring).

    A ``prompt is too long`` answer (from the API, a gateway or a cloud) that names the
    maximum also teaches the pipeline the real limit of that model on that channel (see
    ``runtime._limits``): later turns of every run on it compact at ``compact_at`` of it.

    Args:
        max_reactive_attempts: how many times one call may be compacted again after a
            ``prompt is too long`` answer, each time keeping fewer messages.
    """

    def __init__(self, *, max_reactive_attempts: int = 3) -> None:
        self.max_reactive_attempts = max_reactive_attempts
        self.limits = ChannelLimits()
        self._warned: dict[str, None] = {}
        self.ahead = AheadSummaries()

    def window(self, run: ContextView) -> int:
        """The run's window: its policy's, or less if its channel said so."""
        return self.limits.window(run)

    def threshold(self, run: ContextView) -> int:
        """Where compaction starts for ``run`` (see ``window``)."""
        learned = self.limits.get(run)
        if learned is None:
            return run.threshold
        policy = run.agent.context
        window = learned.window
        return min(run.threshold, int(window * policy.compact_at), window - policy.reserve)

    # ------------------------------------------------------------------ pipeline
    async def ingest(self, run: ContextView, call: ToolUseBlock, outcome: ToolOutcome) -> Ingested:
        return spill_over_limit(run, call, outcome)

    ingest_now = staticmethod(spill_over_limit)  # (itself: no layer per tool result)

    def works_ahead(self, agent: Agent) -> bool:
        return agent.context.compact_ahead_at is not None  # summaries ahead (``_ahead``)

    async def before_call(self, run: ContextView) -> ContextChange | None:
        await self.limits.prepare(run)
        policy = run.agent.context
        step = CompactionStep(run)
        if (
            policy.clear_tool_results_after is not None
            and step.context_tokens > self.window(step) * policy.clear_at
        ):
            await self._clear(step)
        if self.model_switch(step) is not None:
            return await self._compact(step, trigger="model_switch")
        threshold = self.threshold(step)
        ready = await self.ahead.take(step, wait=step.context_tokens >= threshold)
        if ready is not None:  # a summary computed ahead: swapped in at this call boundary
            failure, fail = await self._attempt(
                step, "summarize", "ahead", 0, degraded=False, ready=ready
            )
            if fail is not None:
                return step.change(failure=failure, fail_run=fail)
        if step.context_tokens >= threshold:
            return await self._compact(step, trigger="auto")
        if self.ahead.due(step, threshold=threshold):
            await self._start_ahead(step)
        return step.change() if step.decided else None  # None: nothing to commit

    quiet_before_call = quiet_before_call  # ``before_call`` would do nothing (no await)

    def model_switch(self, run: ContextView) -> ModelSwitch | None:
        """The run's model changed to one that cannot hold its context (see ``_model_switch``)."""
        previous, model = run.served_model, run.agent.model
        if previous is None or previous == model or same_model(model, previous):
            return None  # (asked before every call: no window or threshold to work out)
        window, threshold, tokens = self.window(run), self.threshold(run), run.context_tokens
        return model_switch(previous, run.agent.model, tokens, threshold, window)

    async def _start_ahead(self, step: CompactionStep) -> None:
        """Start summarizing the head in the background (see ``_ahead``)."""
        tail = tail_budget(self, step, 0)
        keep = step.agent.context.keep_recent
        split = ahead_split(step, keep_recent=keep, max_tail_tokens=tail)
        if split is None or frees_too_little(self, step, split):
            return
        hook = await pre_compact_hook(self, step, split, "summarize", "ahead")
        work = partial(summarize_head, self, instructions=hook)
        await self.ahead.start(step, split, work, threshold=self.threshold(step))

    async def on_prompt_too_long(
        self, run: ContextView, error: PromptTooLongError, attempt: int
    ) -> ContextChange | None:
        await self.limits.learn(run, error)
        if attempt > self.max_reactive_attempts:
            return None
        return await self.compact(run, trigger="reactive", level=attempt)

    async def clear(self, run: ContextView) -> ContextChange:
        """Stub old tool results (keeping the last K), if that frees enough tokens."""
        step = CompactionStep(run)
        await self._clear(step)
        return step.change()

    async def compact(
        self, run: ContextView, *, trigger: str = "manual", level: int = 0
    ) -> ContextChange:
        """Compact ``run``'s context now with its policy's strategy.

        ``level`` > 0 keeps fewer messages (reactive retries). Returns what to commit;
        its ``fail_run`` is set when the breaker opens under policy ``"fail"``.
        """
        return await self._compact(CompactionStep(run), trigger=trigger, level=level)

    # ------------------------------------------------------------------ clearing
    async def _clear(self, step: CompactionStep) -> None:
        policy = step.agent.context
        keep = policy.clear_tool_results_after or 0
        rebuilt = cleared_context(
            step.context, keep_last=keep, run_id=step.id, clearable=step.clearable
        )
        freed = estimate_messages(step.context) - estimate_messages(rebuilt.messages)
        if not rebuilt.spills or freed < policy.window * MIN_CLEAR_FRACTION:
            return
        started = time.monotonic()
        before = (step.context_tokens, len(step.context))
        with step.tracing.compact_span(
            agent=step.agent.name,
            run_id=step.id,
            session_id=step.session_id,
            trigger="soft",
            strategy="clear",
        ) as span:
            commit, seqs = boundary_commit(
                step,
                rebuilt,
                await step.context_seqs(),
                kind="clear",
                strategy="clear",
                trigger="soft",
                tokens_before=before[0],
                started=started,
                threshold=self.threshold(step),
            )
            step.apply(commit, seqs, rebuild=False)
            self._span_result(span, step, before, started, kept=len(step.context))

    # ------------------------------------------------------------------ compaction
    async def _compact(
        self, step: CompactionStep, *, trigger: str, level: int = 0
    ) -> ContextChange:
        policy = step.agent.context
        state = breaker_state(await step.boundaries())
        if state == "open" and policy.on_compaction_failure == "fail":
            return step.change(fail_run="the compaction circuit breaker is open")
        strategy = "window" if state == "open" else policy.strategy
        failure, fail = await self._attempt(
            step, strategy, trigger, level, degraded=state == "open"
        )
        if fail is not None:
            return step.change(failure=failure, fail_run=fail)
        if failure is not None and state == "half-open" and strategy != "window":
            # the retry after the cool-down failed: open again, and fall back right away
            step.record(breaker_record(step, None, failure, failures=1))
            if policy.on_compaction_failure == "fail":
                return step.change(failure=failure, fail_run=f"compaction failed again: {failure}")
            failure, fail = await self._attempt(step, "window", trigger, level, degraded=True)
        return step.change(failure=failure, fail_run=fail)

    async def _attempt(
        self,
        step: CompactionStep,
        strategy: str,
        trigger: str,
        level: int,
        *,
        degraded: bool,
        ready: Ready | None = None,
    ) -> tuple[str | None, str | None]:
        """One attempt, decided into ``step``: (why it did not apply, why the run fails)."""
        started = time.monotonic()
        before = (step.context_tokens, len(step.context))
        with step.tracing.compact_span(
            agent=step.agent.name,
            run_id=step.id,
            session_id=step.session_id,
            trigger=trigger,
            strategy=strategy,
        ) as span:
            details: dict[str, Any] = {"level": level, "degraded": degraded}
            try:
                seqs = await step.context_seqs()
                decided = await rebuild(self, step, strategy, trigger, level, seqs, details, ready)
            except Exception as exc:
                own = isinstance(exc, CompactionError | SummarizerFailed)
                error = str(exc) if own else f"{type(exc).__name__}: {exc}"
                self._span_result(span, step, before, started, kept=None, failure=error)
                step.record(
                    failure_record(step, strategy, trigger, before[0], started, error, details)
                )
                return error, self._verdict(step, await step.boundaries(), span, error)
            if decided is None:  # would free too little: not worth a cache break
                self._span_result(span, step, before, started, kept=None)
                return None, None
            rebuilt, loss = decided
            found = manifest_of(details)
            step.tracing.compaction_manifest(
                span,
                removed=len(found.get("removed_messages", ())),
                tool_calls=len(found.get("tool_calls", ())),
                handles=len(found.get("handles", ())),
                missing=len(found.get("missing", ())),
                inferred=len(found.get("inferred", ())),
            )
            commit, new_seqs = boundary_commit(
                step,
                rebuilt,
                seqs,
                kind="compaction",
                strategy=strategy,
                trigger=trigger,
                tokens_before=before[0],
                started=started,
                threshold=self.threshold(step),
                details=details,
                manifest=loss,
            )
            step.apply(commit, new_seqs, rebuild=True)
            ineffective = bool(details.get("ineffective"))
            failure = "ineffective: still above the threshold" if ineffective else None
            self._span_result(span, step, before, started, kept=rebuilt.kept, failure=failure)
            _log.info(
                "compacted %s (%s, %s): %d -> %d tokens",
                step.agent.name,
                strategy,
                trigger,
                before[0],
                step.context_tokens,
            )
            fail = None
            if failure is not None:
                sizes = (self.window(step), self.threshold(step), fixed_tokens(step))
                warn_too_small(step, self._warned, *sizes)
                fail = self._verdict(step, await step.boundaries(), span, failure)
        return None, fail

    def _verdict(
        self, step: CompactionStep, boundaries: list[Any], span: Span, failure: str
    ) -> str | None:
        """Open the breaker in ``step`` when failures reach the limit; why the run fails."""
        opened, fail = breaker_verdict(step, boundaries, span=span, failure=failure)
        if opened is not None:
            step.record(opened)
        return fail

    def _span_result(
        self,
        span: Span,
        step: CompactionStep,
        before: tuple[int, int],
        started: float,
        *,
        kept: int | None,
        failure: str | None = None,
    ) -> None:
        """Record the outcome on the compact span (``kept=None``: nothing was applied)."""
        applied = kept is not None
        step.tracing.compaction_result(
            span,
            tokens_before=before[0],
            tokens_after=step.context_tokens if applied else None,
            messages_before=before[1],
            messages_after=len(step.context) if applied else None,
            kept=kept,
            duration=time.monotonic() - started,
            failure=failure,
        )
