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
"""

from __future__ import annotations

import inspect
import logging
import time
from functools import partial
from typing import Any

from opentelemetry.trace import Span

from anabranch.agents import Agent
from anabranch.context._compaction import (
    CompactionEvent,
    Rebuilt,
    Split,
    choose_split,
    cleared_context,
    context_violations,
    summarized_context,
    verbatim_context,
    windowed_context,
)
from anabranch.context._content import content_violations, drop_thinking
from anabranch.context._digest import (
    Manifest,
    dropped_note,
    handles_line,
    manifest,
    named_seqs,
)
from anabranch.context._tokens import estimate_messages, estimate_request
from anabranch.context._transcript import chars_for_tokens
from anabranch.errors import PromptTooLongError
from anabranch.messages import Message, ModelRequest, ModelResponse, ToolUseBlock
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
from anabranch.runtime._compaction_step import CompactionStep, boundary_commit, manifest_of
from anabranch.runtime._context_view import (
    CompactionOutcome,
    ContextChange,
    ContextView,
    Ingested,
)
from anabranch.runtime._head import context_text, handles_in, originals, previous_summary
from anabranch.runtime._limits import ChannelLimits
from anabranch.runtime._memory_compaction import CompactionMemory
from anabranch.runtime._model_switch import ModelSwitch, model_switch, same_model
from anabranch.runtime._pins import with_pins
from anabranch.runtime._pipeline import spill_over_limit
from anabranch.runtime._quiet_call import quiet_before_call
from anabranch.runtime._run_prompt import with_breakpoints
from anabranch.runtime._server_compaction import server_rebuild
from anabranch.runtime._summarizer import SummarizerFailed, summarize, summary_max_tokens

__all__ = ["CompactingPipeline", "CompactionOutcome", "breaker_open", "consecutive_failures"]

_log = logging.getLogger("anabranch.compaction")

MIN_CLEAR_FRACTION = 0.05
"""Clearing must free at least this fraction of the window, so the cache is not broken
for a few tokens at every turn."""
MIN_FREE_FRACTION = 0.05
"""A proactive compaction that would free less than this share of the window is skipped
(unless the context no longer fits at all)."""
TAIL_SHARE = 0.25
"""Default ``keep_recent_tokens``: this share of the room messages have below the threshold."""
KEEP_NOTHING_LEVEL = 2
"""Reactive level from which nothing is kept verbatim: the whole context is summarized."""


class _CompactionError(Exception):
    """A compaction attempt could not produce a valid context."""


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
        tail = self._tail_budget(step, 0)
        keep = step.agent.context.keep_recent
        split = ahead_split(step, keep_recent=keep, max_tail_tokens=tail)
        if split is None or self._frees_too_little(step, split):
            return
        hook = await self._pre_compact_hook(step, split, "summarize", "ahead")
        work = partial(self._summarize, instructions=hook)
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
                decided = await self._rebuild(step, strategy, trigger, level, seqs, details, ready)
            except Exception as exc:
                own = isinstance(exc, _CompactionError | SummarizerFailed)
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
                sizes = (self.window(step), self.threshold(step), self._fixed_tokens(step))
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

    def _tail_budget(self, run: ContextView, level: int) -> int:
        """Tokens the kept tail may hold (``keep_recent_tokens``, or a share of the room)."""
        room = max(0, self.threshold(run) - self._fixed_tokens(run))
        budget = run.agent.context.keep_recent_tokens
        budget = int(room * TAIL_SHARE) if budget is None else min(budget, room // 2)
        return budget >> level

    async def _rebuild(
        self,
        step: CompactionStep,
        strategy: str,
        trigger: str,
        level: int,
        seqs: list[int | None],
        details: dict[str, Any],
        ready: Ready | None = None,
    ) -> tuple[Rebuilt, Manifest | None] | None:
        if strategy == "server":  # the API writes the summary: see ``_server_compaction``
            return await server_rebuild(step, level, self._tail_budget(step, level), seqs, details)
        policy = step.agent.context
        nothing = level >= KEEP_NOTHING_LEVEL
        split = (
            ready.split
            if ready is not None
            else choose_split(
                step.context,
                keep_recent=0 if nothing else policy.keep_recent >> level,
                max_tail_tokens=0 if nothing else self._tail_budget(step, level),
                empty_tail=True,
            )
        )
        if split is None:
            stubbed = self._stub_only(step, level)
            return stubbed, None
        head_seqs = seqs[: len(split.head)]
        # what an earlier opening in the head stood for stays named in the new one
        earlier = named_seqs(previous_summary(split.head))
        named = sorted({*earlier, *(s for s in head_seqs if s is not None)})
        if trigger == "auto" and self._frees_too_little(step, split):
            return None
        head = await originals(step.store, step.id, split.head, step.pending_spills())
        instructions = None
        if ready is None:  # a summary ahead had them when it started
            instructions = await self._pre_compact_hook(step, split, strategy, trigger)
        handles = handles_in(split.head)
        memory = CompactionMemory(
            step, lambda request: self._call(step, request), self.window(step)
        )
        if strategy == "summarize":
            details.update(await memory.extract(head, head_seqs))
            result = ready.ahead.result if ready is not None else None
            if result is not None and ready is not None:
                details["ahead"] = ready.ahead.record(waited=ready.waited)
            else:
                switch = self.model_switch(step)
                if switch is not None:
                    details["model_switch"] = switch.as_dict()
                result = await self._summarize(step, head, head_seqs, instructions, switch=switch)
            details["model"] = result.model
            details["summary"] = result.summary
            details["usage"] = result.usage.model_dump(mode="json")
            details["summary_parts"] = result.parts
            details["summary_requests"] = len(result.requests)
            listed = handles_line(named, handles, self._note_chars(step))
            rebuilt = summarized_context(split, result.summary, listed)
            found = manifest(
                split.head,
                head_seqs,
                result.summary,
                handles=handles,
                previous=previous_summary(split.head),
                summary=result.summary,
            )
        elif strategy == "verbatim":
            rebuilt = verbatim_context(split, step.id)
            handles += [spill.handle for spill in rebuilt.spills]
            found = manifest(split.head, head_seqs, context_text(rebuilt.messages), handles=handles)
        else:
            spilled = cleared_context(split.head, keep_last=0, run_id=step.id).spills
            handles += [spill.handle for spill in spilled]
            note = dropped_note(split.head, named, handles, self._note_chars(step))
            rebuilt = windowed_context(split, note)
            rebuilt = Rebuilt(rebuilt.messages, rebuilt.sources, rebuilt.kept, spilled)
            found = manifest(split.head, head_seqs, context_text(rebuilt.messages), handles=handles)
        details["manifest"] = found.as_dict()
        rebuilt = await memory.reselect(head, rebuilt, self._note_chars(step), details)
        room = max(0, self.threshold(step) - self._fixed_tokens(step))
        carry = split.carry if strategy != "verbatim" else None
        rebuilt = await with_pins(step, rebuilt, room, carry, details)
        problems = context_violations(rebuilt.messages)
        problems += content_violations(
            step.context, rebuilt.messages, thinking=step.agent.model_settings.thinking
        )
        if problems:
            raise _CompactionError("invalid compacted context: " + "; ".join(problems))
        return rebuilt, found

    def _note_chars(self, run: ContextView) -> int:
        """Room for a note of what was replaced: a tenth of the messages' room."""
        room = max(0, self.threshold(run) - self._fixed_tokens(run))
        return max(200, chars_for_tokens(room // 10))

    def _frees_too_little(self, run: ContextView, split: Split) -> bool:
        """A proactive compaction of ``split`` would free under ``MIN_FREE_FRACTION``."""
        window = self.window(run)
        head = estimate_messages(split.head)
        after = self._fixed_tokens(run) + estimate_messages(split.tail) + head // 4
        if after >= window - run.agent.context.reserve:
            return False  # must compact whatever it frees
        return head - head // 4 < window * MIN_FREE_FRACTION

    def _stub_only(self, run: ContextView, level: int) -> Rebuilt:
        """No turn left to cut: a reactive retry can still stub the kept tool results."""
        if not level:
            raise _CompactionError("nothing to compact: no turn boundary to cut at")
        rebuilt = cleared_context(run.context, keep_last=0, run_id=run.id, clearable=run.clearable)
        if not rebuilt.spills:
            raise _CompactionError("nothing to compact: no turn boundary to cut at")
        return rebuilt

    async def _pre_compact_hook(
        self, run: ContextView, split: Split, strategy: str, trigger: str
    ) -> str | None:
        policy = run.agent.context
        if policy.on_compact is None:
            return None
        event = CompactionEvent(
            agent=run.agent.name,
            session_id=run.session_id,
            run_id=run.id,
            trigger=trigger,
            strategy=strategy,
            messages=split.head,
            kept=((split.carry,) if split.carry else ()) + split.tail,
            tokens=run.context_tokens,
            threshold=self.threshold(run),
            window=self.window(run),
        )
        result = policy.on_compact(event)
        if inspect.isawaitable(result):
            result = await result
        return result if isinstance(result, str) else None

    # ------------------------------------------------------------------ summarizer
    def _fixed_tokens(self, run: ContextView) -> int:
        """Estimated tokens of the system prompt and tool definitions."""
        empty = ModelRequest(model=run.agent.model, system=run.system, tools=run.tools, messages=())
        return estimate_request(empty)

    async def _summarize(
        self,
        run: ContextView,
        head: tuple[Message, ...],
        seqs: list[int | None],
        instructions: str | None,
        *,
        switch: ModelSwitch | None = None,
        purpose: str = "compaction",
    ) -> Any:
        """Ask the summarizer (then the fallback) for a summary of ``head``, in parts if
        it does not fit the summarizer's window; after a model switch, the previous model
        first, with room for the whole head (it held this context)."""
        policy = run.agent.context
        models = [policy.summarizer_model or run.agent.model]
        if policy.fallback_summarizer_model and policy.fallback_summarizer_model not in models:
            models.append(policy.fallback_summarizer_model)
        window = self.window(run)
        max_tokens = summary_max_tokens(self.threshold(run), run.agent.max_tokens)
        budget = window - max_tokens - self._fixed_tokens(run) - window // 20
        budgets = {}
        if switch is not None:
            models = [switch.previous, *(m for m in models if m != switch.previous)]
            budgets[switch.previous] = max(budget, estimate_messages(head) + 1)

        def build(model: str, messages: list[Message]) -> ModelRequest:
            return with_breakpoints(
                run.agent,
                ModelRequest(
                    model=model,
                    system=run.system,
                    tools=run.tools,
                    messages=tuple(messages),
                    max_tokens=max_tokens,
                ),
            )

        # the summarizer does not think: earlier thinking is omitted, never altered
        return await summarize(
            drop_thinking(head),
            models=models,
            budget=budget,
            budgets=budgets,
            build=build,
            call=lambda request: self._call(run, request, purpose),
            instructions=instructions,
            labels=[f"msg-{s}" if s is not None else None for s in seqs],
            max_summary_tokens=max_tokens,
        )

    async def _call(
        self, run: ContextView, request: ModelRequest, purpose: str = "compaction"
    ) -> ModelResponse:
        """One summarizer call (the run's summarizer retries and traces it)."""
        try:
            return await run.call_summarizer(request, purpose=purpose)
        except PromptTooLongError as exc:  # teach the channel's limit, then smaller parts
            await self.limits.learn(
                run, exc, model=request.model, estimate=estimate_request(request)
            )
            raise
