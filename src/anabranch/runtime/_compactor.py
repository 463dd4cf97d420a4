"""``CompactingPipeline``: keeps each agent run inside its own window, losing nothing.

Before every model call, for the run about to call (each run has its own policy):

1. (at ingest) a tool result over ``tool_result_max_chars`` is spilled to the store and
   the context gets a preview ending in ``recall id=<handle>``;
2. above the soft threshold (``clear_at``), tool results older than the last
   ``clear_tool_results_after`` become one-line stubs with their handle;
3. above the threshold, the context is compacted with the policy's strategy;
4. on ``prompt is too long``, it is compacted again keeping fewer messages, then retried;
5. after ``max_compaction_failures`` failures in a row the breaker opens: the run fails
   (``on_compaction_failure="fail"``) or goes on with the ``window`` strategy, which needs
   no model (``"continue"``). Failures and the breaker are boundary rows, so they survive
   a resume.

Every change is a boundary row (see ``context.layout``); the original messages are never
touched, and ``recall`` reaches all of them.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Span

from anabranch.context._budget import preview, spill_handle
from anabranch.context._compaction import (
    CompactionEvent,
    Rebuilt,
    Split,
    SummaryError,
    choose_split,
    cleared_context,
    context_violations,
    extract_summary,
    fit_for_summarizer,
    summarized_context,
    summary_request,
    verbatim_context,
    windowed_context,
)
from anabranch.context._content import (
    attachments_handle,
    attachments_to_json,
    content_violations,
    drop_thinking,
)
from anabranch.context._layout import encode_layout, expand_ranges
from anabranch.context._tokens import estimate_messages, estimate_request
from anabranch.errors import CompactionFailedError, ModelError, PromptTooLongError
from anabranch.messages import (
    ModelRequest,
    ModelResponse,
    ToolUseBlock,
    Usage,
    messages_to_json,
)
from anabranch.runtime._builtins import ToolOutcome
from anabranch.runtime._limits import ChannelLimits
from anabranch.runtime._loop import _message_json
from anabranch.store import BoundaryRecord, MessageRecord

if TYPE_CHECKING:
    from anabranch.runtime._loop import AgentRun

__all__ = ["CompactingPipeline", "CompactionOutcome", "breaker_open", "consecutive_failures"]

_log = logging.getLogger("anabranch.compaction")

MIN_CLEAR_FRACTION = 0.05
"""Clearing must free at least this fraction of the window, so the cache is not broken
for a few tokens at every turn."""
DEEPEST_LEVEL = 3
"""Reactive level at which the kept tail's tool results are stubbed too."""


class _CompactionError(Exception):
    """A compaction attempt could not produce a valid context."""


@dataclass(frozen=True)
class CompactionOutcome:
    """What one compaction attempt did."""

    applied: bool
    boundary_id: int | None = None
    failure: str | None = None


def consecutive_failures(boundaries: list[BoundaryRecord]) -> int:
    """Compaction failures (or ineffective compactions) in a row, newest first.

    A successful compaction or a rewind ends the run of failures; clears and breaker
    rows are neutral.
    """
    count = 0
    for boundary in reversed(boundaries):
        if boundary.kind == "rewind":
            break
        if boundary.kind != "compaction":
            continue
        extra = json.loads(boundary.extra) if boundary.extra else {}
        if boundary.status == "ok" and not extra.get("ineffective"):
            break
        count += 1
    return count


def breaker_open(boundaries: list[BoundaryRecord]) -> bool:
    """Whether the run's breaker has opened since its last rewind."""
    for boundary in reversed(boundaries):
        if boundary.kind == "rewind":
            return False
        if boundary.kind == "breaker":
            return True
    return False


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

    def window(self, run: AgentRun) -> int:
        """The run's window: its policy's, or less if its channel said so."""
        return self.limits.window(run)

    def threshold(self, run: AgentRun) -> int:
        """Where compaction starts for ``run`` (see ``window``)."""
        learned = self.limits.get(run)
        if learned is None:
            return run.threshold
        return min(run.threshold, int(learned.window * run.agent.context.compact_at))

    # ------------------------------------------------------------------ pipeline
    async def ingest(self, run: AgentRun, call: ToolUseBlock, outcome: ToolOutcome) -> ToolOutcome:
        policy = run.agent.context
        handle = spill_handle(run.id, call.id)
        text = preview(
            outcome.content,
            is_error=outcome.is_error,
            max_chars=policy.tool_result_max_chars,
            preview_chars=policy.tool_result_preview_chars,
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
        store = run.env.store
        strategy: str = policy.strategy
        degraded = breaker_open(await store.list_boundaries(run_id=run.id))
        if degraded:
            if policy.on_compaction_failure == "fail":
                await self._fail_run(run, "the compaction circuit breaker is open")
            strategy = "window"
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
                rebuilt = await self._rebuild(run, strategy, trigger, level, details)
            except Exception as exc:
                own = isinstance(exc, _CompactionError)
                error = str(exc) if own else f"{type(exc).__name__}: {exc}"
                self._span_result(span, run, before, started, kept=None, failure=error)
                await self._record_failure(
                    run, span, strategy, trigger, before[0], started, error, details
                )
                return CompactionOutcome(applied=False, failure=error)
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
                await self._check_breaker(run, span=span, failure=failure)
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

    async def _rebuild(
        self, run: AgentRun, strategy: str, trigger: str, level: int, details: dict[str, Any]
    ) -> Rebuilt:
        policy = run.agent.context
        fixed = self._fixed_tokens(run)
        threshold = self.threshold(run)
        room = max(0, threshold - fixed - summary_max_tokens(threshold, run.agent.max_tokens))
        split = choose_split(
            run.context,
            keep_recent=policy.keep_recent >> level if level < DEEPEST_LEVEL else 0,
            max_tail_tokens=(room // 2) >> level,
        )
        if split is None:
            return self._stub_only(run, level)
        instructions = await self._pre_compact_hook(run, split, strategy, trigger)
        if strategy == "summarize":
            summary, model, usage = await self._summarize(run, split, instructions)
            details["model"] = model
            details["summary"] = summary
            details["usage"] = usage.model_dump(mode="json")
            rebuilt = summarized_context(split, summary)
        elif strategy == "verbatim":
            rebuilt = verbatim_context(split, run.id)
        else:
            rebuilt = windowed_context(split)
        if level >= DEEPEST_LEVEL:
            rebuilt = _stub_everything(rebuilt, run.id)
        problems = context_violations(rebuilt.messages)
        problems += content_violations(
            run.context, rebuilt.messages, thinking=run.agent.model_settings.thinking
        )
        if problems:
            raise _CompactionError("invalid compacted context: " + "; ".join(problems))
        return rebuilt

    def _stub_only(self, run: AgentRun, level: int) -> Rebuilt:
        """No turn left to cut: a reactive retry can still stub the kept tool results."""
        unchanged = Rebuilt(tuple(run.context), tuple(range(len(run.context))))
        rebuilt = _stub_everything(unchanged, run.id) if level else unchanged
        if not rebuilt.spills:
            raise _CompactionError("nothing to compact: no turn boundary to cut at")
        kept = sum(1 for source in rebuilt.sources[1:] if source is not None)
        return Rebuilt(rebuilt.messages, rebuilt.sources, kept, rebuilt.spills)

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
        self, run: AgentRun, split: Split, instructions: str | None
    ) -> tuple[str, str, Usage]:
        """Ask the summarizer (then the fallback) for a summary of ``split.head``."""
        policy = run.agent.context
        models = [policy.summarizer_model or run.agent.model]
        if policy.fallback_summarizer_model and policy.fallback_summarizer_model not in models:
            models.append(policy.fallback_summarizer_model)
        window = self.window(run)
        max_tokens = summary_max_tokens(self.threshold(run), run.agent.max_tokens)
        fixed = self._fixed_tokens(run)
        budget = window - max_tokens - fixed - window // 20
        errors: list[str] = []
        for model in models:
            room = budget
            for _ in range(3):
                # the summarizer does not think: earlier thinking is omitted, never altered
                head = drop_thinking(fit_for_summarizer(split.head, room))
                messages = summary_request(head, instructions)
                request = run.with_breakpoints(
                    ModelRequest(
                        model=model,
                        system=run.system,
                        tools=run.tools,
                        messages=tuple(messages),
                        max_tokens=max_tokens,
                    )
                )
                try:
                    response = await self._call(run, request)
                except PromptTooLongError as exc:
                    errors.append(f"{model}: {exc}")
                    room = min(room, estimate_messages(messages)) // 2
                    learned = await self.limits.learn(
                        run, exc, model=model, estimate=estimate_request(request)
                    )
                    if learned is not None:
                        room = min(room, learned.window - max_tokens - fixed)
                    continue
                except ModelError as exc:
                    errors.append(f"{model}: {type(exc).__name__}: {exc}")
                    break
                try:
                    text = response.to_message().text
                    return extract_summary(text), model, response.usage
                except SummaryError as exc:
                    errors.append(f"{model}: {exc}")
                    break
        raise _CompactionError("summarizer failed: " + " | ".join(errors))

    async def _call(self, run: AgentRun, request: ModelRequest) -> ModelResponse:
        """One summarizer call, retried like any model call, traced as a child span."""

        async def attempt(n: int) -> ModelResponse:
            return await run.request_once(request, attempt=n, purpose="compaction")

        return await run.with_retries(attempt)

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
        """Commit ``rebuilt`` as a boundary (spills first), then swap it in."""
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
        rows = [
            MessageRecord(
                run_id=run.id,
                seq=layout.first_new_seq + offset,
                role=message.role,
                content=_message_json(message),
                kind="context",
                created=time.time(),
            )
            for offset, message in enumerate(layout.new_rows)
        ]
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
        run.next_seq = layout.next_seq
        run.replace_context(list(rebuilt.messages))
        return boundary_id

    async def _record_failure(
        self,
        run: AgentRun,
        span: Span,
        strategy: str,
        trigger: str,
        tokens_before: int,
        started: float,
        failure: str,
        details: dict[str, Any],
    ) -> None:
        details.pop("summary", None)
        await run.env.store.add_boundary(
            BoundaryRecord(
                run_id=run.id,
                kind="compaction",
                prefix="[]",
                ranges="[]",
                created=time.time(),
                strategy=strategy,
                trigger=trigger,
                tokens_before=tokens_before,
                messages_before=len(run.context),
                model=details.pop("model", None),
                duration=time.monotonic() - started,
                status="failed",
                error=failure,
                extra=json.dumps(details),
            )
        )
        _log.warning("compaction of %s (run %s) failed: %s", run.agent.name, run.id, failure)
        await self._check_breaker(run, span=span, failure=failure)

    async def _check_breaker(self, run: AgentRun, *, span: Span | None, failure: str) -> None:
        """Open the breaker when failures reach the policy's limit (once), then apply it."""
        policy = run.agent.context
        store = run.env.store
        boundaries = await store.list_boundaries(run_id=run.id)
        failures = consecutive_failures(boundaries)
        if failures < policy.max_compaction_failures:
            return
        already_open = breaker_open(boundaries)
        message = (
            f"compaction circuit breaker open for agent {run.agent.name!r} (run {run.id}): "
            f"{failures} failures in a row; last: {failure}"
        )
        if not already_open:
            await store.add_boundary(
                BoundaryRecord(
                    run_id=run.id,
                    kind="breaker",
                    prefix="[]",
                    ranges="[]",
                    created=time.time(),
                    status="open",
                    error=failure,
                    extra=json.dumps(
                        {"failures": failures, "policy": policy.on_compaction_failure}
                    ),
                )
            )
            _log.warning("%s; policy %r", message, policy.on_compaction_failure)
            if span is not None:
                run.env.tracing.event(
                    span,
                    "compaction.breaker_open",
                    {"failures": failures, "policy": policy.on_compaction_failure},
                )
        if policy.on_compaction_failure == "fail":
            await self._fail_run(run, message)

    async def _fail_run(self, run: AgentRun, message: str) -> None:
        await run.env.store.finish_run(run.id, "failed", error=message)
        error = CompactionFailedError(message)
        error.session_id = run.env.session_id
        raise error


def _stub_everything(rebuilt: Rebuilt, run_id: str) -> Rebuilt:
    """``rebuilt`` with every tool result (the tail's too) replaced by its stub."""
    cleared = cleared_context(rebuilt.messages, keep_last=0, run_id=run_id)
    sources = tuple(
        rebuilt.sources[i] if s is not None else None for i, s in enumerate(cleared.sources)
    )
    return Rebuilt(cleared.messages, sources, rebuilt.kept, rebuilt.spills + cleared.spills)
