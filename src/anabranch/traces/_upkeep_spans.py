"""Spans and events of a run's upkeep: compactions, memory selection and consolidation,
and limits (soft shares and stops).

Plain functions of a ``Tracing`` (``SpanMaker``: what of it they use), bound as its methods
in ``_spans``: callers see one class.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from anabranch.traces._current import CurrentSpan, safe_set
from anabranch.traces._payloads import compact_json
from anabranch.traces._settings import PROVIDER

__all__ = [
    "SpanMaker",
    "compact_span",
    "compaction_manifest",
    "compaction_result",
    "limit_reached",
    "limit_soft",
    "memory_result",
    "memory_span",
]

_log = logging.getLogger("anabranch.traces._spans")  # (the name these spans always logged under)


class SpanMaker(Protocol):
    """What of ``Tracing`` these spans use."""

    @property
    def openinference_full(self) -> bool: ...

    def _span(
        self,
        name: str,
        kind: SpanKind,
        attributes: Mapping[str, Any],
        links: Sequence[Link] = (),
    ) -> CurrentSpan: ...

    def event(self, span: Span, name: str, attributes: Mapping[str, Any]) -> None: ...


def compact_span(
    tracing: SpanMaker, *, agent: str, run_id: str, session_id: str, trigger: str, strategy: str
) -> CurrentSpan:
    """``compact {agent}``: one compaction (the summarizer's model call nests inside).

    A CHAIN span for Phoenix; ``compaction_result`` adds the sizes before/after, which
    are shown as its input/output (numbers only, never message content).
    """
    attributes = {
        "gen_ai.operation.name": "compact",
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.agent.name": agent,
        "gen_ai.agent.id": run_id,
        "gen_ai.conversation.id": session_id,
        "openinference.span.kind": "CHAIN",  # Phoenix has no kind for compact
    }
    if tracing.openinference_full:
        attributes["session.id"] = session_id
    attributes["anabranch.compaction.trigger"] = trigger
    attributes["anabranch.compaction.strategy"] = strategy
    # the cross-framework names (Google ADK's compact_events spans) next to ours
    attributes["gen_ai.compaction.trigger"] = trigger
    attributes["gen_ai.compaction.strategy"] = strategy
    return tracing._span(f"compact {agent}", SpanKind.INTERNAL, attributes)


def compaction_result(
    tracing: SpanMaker,
    span: Span,
    *,
    tokens_before: int,
    tokens_after: int | None,
    messages_before: int,
    messages_after: int | None,
    kept: int | None,
    duration: float,
    failure: str | None = None,
    strategy: str | None = None,
) -> None:
    """Record a compaction's outcome; a failure also sets the span's error status."""
    before = {"tokens": tokens_before, "messages": messages_before}
    after: dict[str, Any] = {"tokens": tokens_after, "messages": messages_after, "kept": kept}
    if failure is not None:
        after["failure"] = failure
    safe_set(
        span,
        {
            "anabranch.compaction.strategy": strategy,
            "anabranch.compaction.tokens_before": tokens_before,
            "anabranch.compaction.tokens_after": tokens_after,
            "anabranch.compaction.messages_before": messages_before,
            "anabranch.compaction.messages_after": messages_after,
            "anabranch.compaction.kept": kept,
            "anabranch.compaction.duration": duration,
            "anabranch.compaction.failure": failure,
            "gen_ai.compaction.tokens_before": tokens_before,
            "gen_ai.compaction.tokens_after": tokens_after,
            "gen_ai.compaction.event_count": messages_before,
            "gen_ai.compaction.messages_after": messages_after,
            "error.type": "compaction_failed" if failure is not None else None,
            "input.value": compact_json(before),
            "input.mime_type": "application/json",
            "output.value": compact_json(after),
            "output.mime_type": "application/json",
        },
    )
    if failure is not None:
        try:
            span.set_status(Status(StatusCode.ERROR, failure))
        except Exception:  # pragma: no cover
            _log.debug("could not set span status", exc_info=True)


def compaction_manifest(
    tracing: SpanMaker,
    span: Span,
    *,
    removed: int,
    tool_calls: int,
    handles: int,
    missing: int,
    inferred: int,
) -> None:
    """The counts of a compaction's loss manifest (never the terms themselves)."""
    safe_set(
        span,
        {
            "anabranch.compaction.removed_messages": removed,
            "anabranch.compaction.removed_tool_calls": tool_calls,
            "anabranch.compaction.handles": handles,
            "anabranch.compaction.missing_terms": missing,
            "anabranch.compaction.inferred_statements": inferred,
        },
    )


def memory_span(
    tracing: SpanMaker, operation: str, *, agent: str, session_id: str | None
) -> CurrentSpan:
    """``memory {operation} {agent}``: a relevance selection or a consolidation.

    ``memory_result`` records what was considered and chosen (memory names and
    counts only, never their content).
    """
    attributes = {
        "gen_ai.operation.name": f"memory.{operation}",
        "gen_ai.agent.name": agent,
        "gen_ai.conversation.id": session_id,
        "openinference.span.kind": "RETRIEVER" if operation == "select" else "CHAIN",
    }
    if tracing.openinference_full:
        attributes["session.id"] = session_id
    attributes["anabranch.memory.operation"] = operation
    return tracing._span(f"memory {operation} {agent}", SpanKind.INTERNAL, attributes)


def memory_result(tracing: SpanMaker, span: Span, attributes: Mapping[str, Any]) -> None:
    safe_set(span, {f"anabranch.memory.{k}": v for k, v in attributes.items()})


def limit_soft(
    tracing: SpanMaker,
    *,
    scope: str,
    share: float,
    remaining_tokens: int | None,
    remaining_usd: float | None,
) -> None:
    """A budget passed its soft share: the agent is told in its next user turn."""
    tracing.event(
        trace.get_current_span(),
        "anabranch.limit.soft",
        {
            "anabranch.limit.scope": scope,
            "anabranch.limit.spent_share": round(share, 4),
            "anabranch.budget.remaining_tokens": remaining_tokens,
            "anabranch.budget.remaining_usd": remaining_usd,
        },
    )


def limit_reached(
    tracing: SpanMaker,
    *,
    reason: str,
    detail: str,
    remaining_tokens: int | None,
    remaining_usd: float | None,
) -> None:
    """A limit stopped the current agent run (its span gets the attributes too)."""
    attributes = {
        "anabranch.limit.reason": reason,
        "anabranch.limit.detail": detail,
        "anabranch.budget.remaining_tokens": remaining_tokens,
        "anabranch.budget.remaining_usd": remaining_usd,
    }
    span = trace.get_current_span()
    tracing.event(span, "anabranch.limit.reached", attributes)
    safe_set(span, {k: v for k, v in attributes.items() if v is not None})
