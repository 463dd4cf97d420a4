"""``CompactingPipeline``: keeps each agent run inside its own window, losing nothing.

Before every model call, for the run about to call (each run has its own policy):

1. (at ingest) a tool result over ``tool_result_max_chars`` is spilled to the store and
   the context gets a preview ending in ``recall id=<handle>``;
2. above the soft threshold (``clear_at``), tool results older than the last
   ``clear_tool_results_after`` become one-line stubs with their handle;
3. above the threshold, the context is compacted with the policy's strategy;
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
"""

from __future__ import annotations

import inspect
import json
import logging
import time
import weakref
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Span

from anabranch.context._budget import preview, spill_handle
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
from anabranch.context._content import (
    attachments_handle,
    attachments_to_json,
    content_violations,
    drop_thinking,
)
from anabranch.context._digest import dropped_note, handles_line, manifest, named_seqs
from anabranch.context._layout import encode_layout, expand_ranges
from anabranch.context._tokens import estimate_messages, estimate_request
from anabranch.context._transcript import chars_for_tokens
from anabranch.errors import PromptTooLongError
from anabranch.messages import (
    Message,
    ModelRequest,
    ModelResponse,
    ToolUseBlock,
    messages_to_json,
)
from anabranch.runtime._breaker import (
    breaker_open,
    breaker_state,
    check_breaker,
    consecutive_failures,
    fail_run,
    open_breaker,
    record_failure,
)
from anabranch.runtime._builtins import ToolOutcome
from anabranch.runtime._head import context_text, handles_in, originals, previous_summary
from anabranch.runtime._limits import ChannelLimits
from anabranch.runtime._summarizer import SummarizerFailed, summarize
from anabranch.store import BoundaryRecord

if TYPE_CHECKING:
    from anabranch.runtime._loop import AgentRun

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


@dataclass(frozen=True)
class CompactionOutcome:
    """What one compaction attempt did."""

    applied: bool
    boundary_id: int | None = None
    failure: str | None = None


def summary_max_tokens(threshold: int, agent_max_tokens: int) -> int:
    """Output budget of a summary: at most a quarter of the threshold."""
    return max(64, min(agent_max_tokens, threshold // 4))


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
        self._warned: weakref.WeakSet[AgentRun] = weakref.WeakSet()

    def window(self, run: AgentRun) -> int:
        """The run's window: its policy's, or less if its channel said so."""
        return self.limits.window(run)

    def threshold(self, run: AgentRun) -> int:
        """Where compaction starts for ``run`` (see ``window``)."""
        learned = self.limits.get(run)
        if learned is None:
            return run.threshold
        policy = run.agent.context
        window = learned.window
        return min(run.threshold, int(window * policy.compact_at), window - policy.reserve)

    # ------------------------------------------------------------------ pipeline
    async def ingest(self, run: AgentRun, call: ToolUseBlock, outcome: ToolOutcome) -> ToolOutcome:
        policy = run.agent.context
        handle = spill_handle(run.id, call.id)
        text = preview(
            outcome.content,
            is_error=outcome.is_error,
            max_chars=policy.spill_chars,
            preview_chars=policy.preview_chars,
            handle=handle,
        )
        if text is None:
            return outcome
        await run.env.store.save_spill(handle, run.id, call.id, outcome.content)
        return replace(outcome, content=text)  # images and documents stay whole

    async def before_call(self, run: AgentRun) -> None:
        await self.limits.prepare(run)
        policy = run.agent.context
        if (
            policy.clear_tool_results_after is not None
            and run.context_tokens > self.window(run) * policy.clear_at
        ):
            await self.clear(run)
        if run.context_tokens >= self.threshold(run):
            await self.compact(run, trigger="auto")

    async def on_prompt_too_long(
        self, run: AgentRun, error: PromptTooLongError, attempt: int
    ) -> bool:
        await self.limits.learn(run, error)
        if attempt > self.max_reactive_attempts:
            return False
        outcome = await self.compact(run, trigger="reactive", level=attempt)
        return outcome.applied

    # ------------------------------------------------------------------ clearing
    async def clear(self, run: AgentRun) -> CompactionOutcome:
        """Stub old tool results (keeping the last K), if that frees enough tokens."""
        policy = run.agent.context
        keep = policy.clear_tool_results_after or 0
        rebuilt = cleared_context(run.context, keep_last=keep, run_id=run.id)
        freed = estimate_messages(run.context) - estimate_messages(rebuilt.messages)
        if not rebuilt.spills or freed < policy.window * MIN_CLEAR_FRACTION:
            return CompactionOutcome(applied=False)
        started = time.monotonic()
        before = (run.context_tokens, len(run.context))
        with run.env.tracing.compact_span(
            agent=run.agent.name,
            run_id=run.id,
            session_id=run.env.session_id,
            trigger="soft",
            strategy="clear",
        ) as span:
            boundary_id = await self._apply(
                run,
                rebuilt,
                await self._context_seqs(run),
                kind="clear",
                strategy="clear",
                trigger="soft",
                tokens_before=before[0],
                started=started,
            )
            self._span_result(span, run, before, started, kept=len(run.context))
        return CompactionOutcome(applied=True, boundary_id=boundary_id)

    # ------------------------------------------------------------------ compaction
    async def compact(
        self, run: AgentRun, *, trigger: str = "manual", level: int = 0
    ) -> CompactionOutcome:
        """Compact ``run``'s context now with its policy's strategy.

        ``level`` > 0 keeps fewer messages (reactive retries). Returns what happened;
        raises ``CompactionFailedError`` when the breaker opens under policy ``"fail"``.
        """
        policy = run.agent.context
        state = breaker_state(await run.env.store.list_boundaries(run_id=run.id))
        if state == "open" and policy.on_compaction_failure == "fail":
            await fail_run(run, "the compaction circuit breaker is open")
        strategy = "window" if state == "open" else policy.strategy
        outcome = await self._attempt(run, strategy, trigger, level, degraded=state == "open")
        if outcome.failure is not None and state == "half-open" and strategy != "window":
            # the retry after the cool-down failed: open again, and fall back right away
            await open_breaker(run, None, outcome.failure, failures=1)
            if policy.on_compaction_failure == "fail":
                await fail_run(run, f"compaction failed again: {outcome.failure}")
            outcome = await self._attempt(run, "window", trigger, level, degraded=True)
        return outcome

    async def _attempt(
        self, run: AgentRun, strategy: str, trigger: str, level: int, *, degraded: bool
    ) -> CompactionOutcome:
        started = time.monotonic()
        before = (run.context_tokens, len(run.context))
        with run.env.tracing.compact_span(
            agent=run.agent.name,
            run_id=run.id,
            session_id=run.env.session_id,
            trigger=trigger,
            strategy=strategy,
        ) as span:
            details: dict[str, Any] = {"level": level, "degraded": degraded}
            try:
                seqs = await self._context_seqs(run)
                rebuilt = await self._rebuild(run, strategy, trigger, level, seqs, details)
            except Exception as exc:
                own = isinstance(exc, _CompactionError | SummarizerFailed)
                error = str(exc) if own else f"{type(exc).__name__}: {exc}"
                self._span_result(span, run, before, started, kept=None, failure=error)
                await record_failure(
                    run, span, strategy, trigger, before[0], started, error, details
                )
                return CompactionOutcome(applied=False, failure=error)
            if rebuilt is None:  # would free too little: not worth a cache break
                self._span_result(span, run, before, started, kept=None)
                return CompactionOutcome(applied=False)
            found = details.get("manifest") or {}
            run.env.tracing.compaction_manifest(
                span,
                removed=len(found.get("removed_messages", ())),
                tool_calls=len(found.get("tool_calls", ())),
                handles=len(found.get("handles", ())),
                missing=len(found.get("missing", ())),
                inferred=len(found.get("inferred", ())),
            )
            boundary_id = await self._apply(
                run,
                rebuilt,
                seqs,
                kind="compaction",
                strategy=strategy,
                trigger=trigger,
                tokens_before=before[0],
                started=started,
                details=details,
            )
            ineffective = bool(details.get("ineffective"))
            failure = "ineffective: still above the threshold" if ineffective else None
            self._span_result(span, run, before, started, kept=rebuilt.kept, failure=failure)
            _log.info(
                "compacted %s (%s, %s): %d -> %d tokens",
                run.agent.name,
                strategy,
                trigger,
                before[0],
                run.context_tokens,
            )
            if failure is not None:
                self._warn_too_small(run)
                await check_breaker(run, span=span, failure=failure)
        await run.rebuild_snapshot("compaction")
        return CompactionOutcome(applied=True, boundary_id=boundary_id)

    def _span_result(
        self,
        span: Span,
        run: AgentRun,
        before: tuple[int, int],
        started: float,
        *,
        kept: int | None,
        failure: str | None = None,
    ) -> None:
        """Record the outcome on the compact span (``kept=None``: nothing was applied)."""
        applied = kept is not None
        run.env.tracing.compaction_result(
            span,
            tokens_before=before[0],
            tokens_after=run.context_tokens if applied else None,
            messages_before=before[1],
            messages_after=len(run.context) if applied else None,
            kept=kept,
            duration=time.monotonic() - started,
            failure=failure,
        )

    def _tail_budget(self, run: AgentRun, level: int) -> int:
        """Tokens the kept tail may hold (``keep_recent_tokens``, or a share of the room)."""
        room = max(0, self.threshold(run) - self._fixed_tokens(run))
        budget = run.agent.context.keep_recent_tokens
        budget = int(room * TAIL_SHARE) if budget is None else min(budget, room // 2)
        return budget >> level

    async def _rebuild(
        self,
        run: AgentRun,
        strategy: str,
        trigger: str,
        level: int,
        seqs: list[int | None],
        details: dict[str, Any],
    ) -> Rebuilt | None:
        policy = run.agent.context
        nothing = level >= KEEP_NOTHING_LEVEL
        split = choose_split(
            run.context,
            keep_recent=0 if nothing else policy.keep_recent >> level,
            max_tail_tokens=0 if nothing else self._tail_budget(run, level),
            empty_tail=True,
        )
        if split is None:
            return self._stub_only(run, level)
        head_seqs = seqs[: len(split.head)]
        # what an earlier opening in the head stood for stays named in the new one
        earlier = named_seqs(previous_summary(split.head))
        named = sorted({*earlier, *(s for s in head_seqs if s is not None)})
        if trigger == "auto" and self._frees_too_little(run, split):
            return None
        head = await originals(run, split.head)
        instructions = await self._pre_compact_hook(run, split, strategy, trigger)
        handles = handles_in(split.head)
        if strategy == "summarize":
            result = await self._summarize(run, head, head_seqs, instructions)
            details["model"] = result.model
            details["summary"] = result.summary
            details["usage"] = result.usage.model_dump(mode="json")
            details["summary_parts"] = result.parts
            details["summary_requests"] = len(result.requests)
            listed = handles_line(named, handles, self._note_chars(run))
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
            rebuilt = verbatim_context(split, run.id)
            handles += [spill.handle for spill in rebuilt.spills]
            found = manifest(split.head, head_seqs, context_text(rebuilt.messages), handles=handles)
        else:
            spilled = cleared_context(split.head, keep_last=0, run_id=run.id).spills
            handles += [spill.handle for spill in spilled]
            note = dropped_note(split.head, named, handles, self._note_chars(run))
            rebuilt = windowed_context(split, note)
            rebuilt = Rebuilt(rebuilt.messages, rebuilt.sources, rebuilt.kept, spilled)
            found = manifest(split.head, head_seqs, context_text(rebuilt.messages), handles=handles)
        details["manifest"] = found.as_dict()
        problems = context_violations(rebuilt.messages)
        problems += content_violations(
            run.context, rebuilt.messages, thinking=run.agent.model_settings.thinking
        )
        if problems:
            raise _CompactionError("invalid compacted context: " + "; ".join(problems))
        return rebuilt

    def _note_chars(self, run: AgentRun) -> int:
        """Room for a note of what was replaced: a tenth of the messages' room."""
        room = max(0, self.threshold(run) - self._fixed_tokens(run))
        return max(200, chars_for_tokens(room // 10))

    def _frees_too_little(self, run: AgentRun, split: Split) -> bool:
        """A proactive compaction of ``split`` would free under ``MIN_FREE_FRACTION``."""
        window = self.window(run)
        head = estimate_messages(split.head)
        after = self._fixed_tokens(run) + estimate_messages(split.tail) + head // 4
        if after >= window - run.agent.context.reserve:
            return False  # must compact whatever it frees
        return head - head // 4 < window * MIN_FREE_FRACTION

    def _warn_too_small(self, run: AgentRun) -> None:
        """Say once per run that its window cannot hold one turn after its prompt."""
        if run in self._warned:
            return
        self._warned.add(run)
        policy = run.agent.context
        fixed = self._fixed_tokens(run)
        last = estimate_messages(run.context[-2:])
        _log.warning(
            "agent %r (run %s): its window (%d tokens) cannot hold one turn: the prompt and "
            "tools take %d, the answer reserve %d, the latest turn %d; compaction cannot get "
            "below the threshold (%d). Raise ContextPolicy.window or make tool results smaller.",
            run.agent.name,
            run.id,
            self.window(run),
            fixed,
            policy.reserve,
            last,
            self.threshold(run),
        )

    def _stub_only(self, run: AgentRun, level: int) -> Rebuilt:
        """No turn left to cut: a reactive retry can still stub the kept tool results."""
        if not level:
            raise _CompactionError("nothing to compact: no turn boundary to cut at")
        rebuilt = cleared_context(run.context, keep_last=0, run_id=run.id)
        if not rebuilt.spills:
            raise _CompactionError("nothing to compact: no turn boundary to cut at")
        return rebuilt

    async def _pre_compact_hook(
        self, run: AgentRun, split: Split, strategy: str, trigger: str
    ) -> str | None:
        policy = run.agent.context
        if policy.on_compact is None:
            return None
        event = CompactionEvent(
            agent=run.agent.name,
            session_id=run.env.session_id,
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
    def _fixed_tokens(self, run: AgentRun) -> int:
        """Estimated tokens of the system prompt and tool definitions."""
        empty = ModelRequest(model=run.agent.model, system=run.system, tools=run.tools, messages=())
        return estimate_request(empty)

    async def _summarize(
        self,
        run: AgentRun,
        head: tuple[Message, ...],
        seqs: list[int | None],
        instructions: str | None,
    ) -> Any:
        """Ask the summarizer (then the fallback) for a summary of ``head``, in parts if
        it does not fit the summarizer's window."""
        policy = run.agent.context
        models = [policy.summarizer_model or run.agent.model]
        if policy.fallback_summarizer_model and policy.fallback_summarizer_model not in models:
            models.append(policy.fallback_summarizer_model)
        window = self.window(run)
        max_tokens = summary_max_tokens(self.threshold(run), run.agent.max_tokens)
        budget = window - max_tokens - self._fixed_tokens(run) - window // 20

        def build(model: str, messages: list[Message]) -> ModelRequest:
            return run.with_breakpoints(
                ModelRequest(
                    model=model,
                    system=run.system,
                    tools=run.tools,
                    messages=tuple(messages),
                    max_tokens=max_tokens,
                )
            )

        # the summarizer does not think: earlier thinking is omitted, never altered
        return await summarize(
            drop_thinking(head),
            models=models,
            budget=budget,
            build=build,
            call=lambda request: self._call(run, request),
            instructions=instructions,
            labels=[f"msg-{s}" if s is not None else None for s in seqs],
            max_summary_tokens=max_tokens,
        )

    async def _call(self, run: AgentRun, request: ModelRequest) -> ModelResponse:
        """One summarizer call, retried like any model call, traced as a child span."""

        async def attempt(n: int) -> ModelResponse:
            return await run.request_once(request, attempt=n, purpose="compaction")

        try:
            return await run.with_retries(attempt)
        except PromptTooLongError as exc:  # teach the channel's limit, then smaller parts
            await self.limits.learn(
                run, exc, model=request.model, estimate=estimate_request(request)
            )
            raise

    # ------------------------------------------------------------------ store
    async def _context_seqs(self, run: AgentRun) -> list[int | None]:
        """The stored seq of every message in ``run.context`` (``None``: derived)."""
        boundary = await run.env.store.latest_boundary(run.id)
        if boundary is None:
            seqs: list[int | None] = list(range(run.next_seq))
        else:
            prefix = json.loads(boundary.prefix)
            seqs = expand_ranges(len(prefix), json.loads(boundary.ranges), run.next_seq)
        if len(seqs) != len(run.context):
            raise RuntimeError(
                f"run {run.id}: context has {len(run.context)} messages but the store "
                f"describes {len(seqs)}"
            )
        return seqs

    async def _apply(
        self,
        run: AgentRun,
        rebuilt: Rebuilt,
        seqs: list[int | None],
        *,
        kind: str,
        strategy: str,
        trigger: str,
        tokens_before: int,
        started: float,
        details: dict[str, Any] | None = None,
    ) -> int:
        """Commit ``rebuilt`` as a boundary (spills first), then hand it to the run."""
        store = run.env.store
        details = details if details is not None else {}
        new_seqs = [seqs[i] if i is not None else None for i in rebuilt.sources]
        layout = encode_layout(rebuilt.messages, new_seqs, run.next_seq)
        for spill in rebuilt.spills:
            await store.save_spill(spill.handle, run.id, spill.call_id, spill.content)
            if spill.attachments:  # images and documents leave whole and stay recallable
                await store.save_spill(
                    attachments_handle(spill.handle),
                    run.id,
                    spill.call_id,
                    attachments_to_json(spill.attachments),
                )
        rows = run.message_records(layout.new_rows, kind="context")
        after = ModelRequest(
            model=run.agent.model,
            system=run.system,
            tools=run.tools,
            messages=rebuilt.messages,
        )
        tokens_after = estimate_request(after)
        if kind == "compaction" and tokens_after >= self.threshold(run):
            details["ineffective"] = True
        summary = details.pop("summary", None)
        model = details.pop("model", None)
        boundary = BoundaryRecord(
            run_id=run.id,
            kind=kind,
            prefix=messages_to_json(list(layout.prefix)),
            ranges=json.dumps([list(r) for r in layout.ranges]),
            created=time.time(),
            strategy=strategy,
            trigger=trigger,
            tokens_before=tokens_before,
            tokens_after=tokens_after,
            messages_before=len(run.context),
            messages_after=len(rebuilt.messages),
            summary=summary,
            model=model,
            duration=time.monotonic() - started,
            status="ok",
            extra=json.dumps({**details, "next_seq": run.next_seq, "kept": rebuilt.kept}),
        )
        boundary_id = await store.add_boundary(boundary, rows)
        run.replace_context(list(rebuilt.messages), next_seq=layout.next_seq)
        return boundary_id
