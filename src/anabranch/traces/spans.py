"""Spans for agent runs, model calls, tool calls and compactions.

Only the OpenTelemetry API is used: without an SDK every span is a no-op. Telemetry never
raises into a run: attribute and event helpers swallow their own errors.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from anabranch.context.messages import Message, Usage

__all__ = ["Tracing", "content_capture_from_env"]

_log = logging.getLogger(__name__)
PROVIDER = "anthropic"


def content_capture_from_env() -> bool:
    """Message content in spans is opt-in via OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT."""
    value = os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "")
    return value.strip().lower() in {"true", "1", "span_only", "span_and_event"}


def _safe_set(span: Span, attributes: Mapping[str, Any]) -> None:
    try:
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})
    except Exception:  # pragma: no cover - telemetry must never break a run
        _log.debug("could not set span attributes", exc_info=True)


class Tracing:
    """Creates anabranch's spans on a tracer (default: the global provider's)."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        *,
        capture_content: bool | None = None,
    ) -> None:
        provider = tracer_provider or trace.get_tracer_provider()
        self._tracer = provider.get_tracer("anabranch")
        self.capture_content = (
            content_capture_from_env() if capture_content is None else capture_content
        )

    @contextmanager
    def _span(self, name: str, kind: SpanKind, attributes: Mapping[str, Any]) -> Iterator[Span]:
        with self._tracer.start_as_current_span(
            name, kind=kind, record_exception=True, set_status_on_exception=True
        ) as span:
            _safe_set(span, attributes)
            yield span

    @contextmanager
    def agent_run(
        self, *, agent: str, run_id: str, session_id: str, model: str, task: str
    ) -> Iterator[Span]:
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.agent.name": agent,
            "gen_ai.agent.id": run_id,
            "gen_ai.conversation.id": session_id,
            "gen_ai.request.model": model,
            "openinference.span.kind": "AGENT",
            "session.id": session_id,
            "agent.name": agent,
        }
        if self.capture_content:
            attributes["input.value"] = task
            attributes["input.mime_type"] = "text/plain"
        with self._span(f"invoke_agent {agent}", SpanKind.INTERNAL, attributes) as span:
            yield span

    @contextmanager
    def graph_run(self, *, graph: str, session_id: str, tasks: int) -> Iterator[Span]:
        """The span of a task graph: every task's ``invoke_agent`` span nests under it."""
        attributes = {
            "gen_ai.operation.name": "invoke_workflow",
            "gen_ai.conversation.id": session_id,
            "openinference.span.kind": "CHAIN",
            "session.id": session_id,
            "anabranch.graph.name": graph,
            "anabranch.graph.tasks": tasks,
        }
        with self._span(f"invoke_workflow {graph}", SpanKind.INTERNAL, attributes) as span:
            yield span

    def agent_output(self, span: Span, output: str, usage: Usage | None = None) -> None:
        attributes: dict[str, Any] = {}
        if self.capture_content:
            attributes["output.value"] = output
            attributes["output.mime_type"] = "text/plain"
        if usage is not None:
            attributes.update(_usage_attributes(usage))
        _safe_set(span, attributes)

    @contextmanager
    def model_call(
        self,
        *,
        model: str,
        session_id: str,
        agent: str,
        attempt: int,
        compacted: bool,
        messages: tuple[Message, ...] | None = None,
    ) -> Iterator[Span]:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.request.model": model,
            "gen_ai.conversation.id": session_id,
            "gen_ai.agent.name": agent,
            "openinference.span.kind": "LLM",
            "session.id": session_id,
            "llm.model_name": model,
            "llm.provider": PROVIDER,
            "llm.system": PROVIDER,
            "anabranch.attempt": attempt,
        }
        if compacted:
            attributes["gen_ai.conversation.compacted"] = True
        if self.capture_content and messages is not None:
            attributes["input.value"] = json.dumps(
                [m.model_dump(mode="json") for m in messages], ensure_ascii=False
            )
            attributes["input.mime_type"] = "application/json"
        with self._span(f"chat {model}", SpanKind.CLIENT, attributes) as span:
            yield span

    def model_response(
        self,
        span: Span,
        *,
        response_id: str,
        response_model: str,
        stop_reason: str | None,
        usage: Usage,
        output: Message | None = None,
    ) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.response.id": response_id,
            "gen_ai.response.model": response_model,
            "gen_ai.response.finish_reasons": [stop_reason or "unknown"],
            **_usage_attributes(usage),
        }
        if self.capture_content and output is not None:
            attributes["output.value"] = json.dumps(output.model_dump(mode="json"))
            attributes["output.mime_type"] = "application/json"
        _safe_set(span, attributes)

    @contextmanager
    def tool_call(
        self,
        *,
        tool: str,
        call_id: str,
        session_id: str,
        description: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> Iterator[Span]:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function",
            "gen_ai.tool.description": description or None,
            "gen_ai.conversation.id": session_id,
            "openinference.span.kind": "TOOL",
            "session.id": session_id,
            "tool.name": tool,
            "tool.id": call_id,
        }
        if self.capture_content and arguments is not None:
            attributes["input.value"] = json.dumps(arguments, ensure_ascii=False)
            attributes["input.mime_type"] = "application/json"
        with self._span(f"execute_tool {tool}", SpanKind.INTERNAL, attributes) as span:
            yield span

    def tool_result(self, span: Span, content: str, is_error: bool) -> None:
        attributes: dict[str, Any] = {"anabranch.tool.is_error": is_error}
        if is_error:
            attributes["error.type"] = "tool_error"
            span.set_status(Status(StatusCode.ERROR))
        if self.capture_content:
            attributes["output.value"] = content
            attributes["output.mime_type"] = "text/plain"
        _safe_set(span, attributes)

    def cache_break(
        self,
        *,
        cause: str,
        expected_read: int,
        actual_read: int,
        idle_seconds: float,
        span: Span | None = None,
    ) -> None:
        """A call read less prompt cache than the previous call of its run left.

        Added as an event to ``span`` (default: the current span, the model call).
        """
        target = span if span is not None else trace.get_current_span()
        self.event(
            target,
            "anabranch.cache_break",
            {
                "anabranch.cache.break.cause": cause,
                "anabranch.cache.break.expected_read_tokens": expected_read,
                "anabranch.cache.break.actual_read_tokens": actual_read,
                "anabranch.cache.break.idle_seconds": round(idle_seconds, 3),
            },
        )
        _safe_set(target, {"anabranch.cache.break.cause": cause})

    @contextmanager
    def compact_span(
        self, *, agent: str, run_id: str, session_id: str, trigger: str, strategy: str
    ) -> Iterator[Span]:
        """``compact {agent}``: one compaction (the summarizer's model call nests inside)."""
        attributes = {
            "gen_ai.operation.name": "compact",
            "gen_ai.agent.name": agent,
            "gen_ai.agent.id": run_id,
            "gen_ai.conversation.id": session_id,
            "openinference.span.kind": "CHAIN",
            "session.id": session_id,
            "anabranch.compaction.trigger": trigger,
            "anabranch.compaction.strategy": strategy,
        }
        with self._span(f"compact {agent}", SpanKind.INTERNAL, attributes) as span:
            yield span

    def compaction_result(
        self,
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
        _safe_set(
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
            },
        )
        if failure is not None:
            try:
                span.set_status(Status(StatusCode.ERROR, failure))
            except Exception:  # pragma: no cover
                _log.debug("could not set span status", exc_info=True)

    def event(self, span: Span, name: str, attributes: Mapping[str, Any]) -> None:
        try:
            span.add_event(name, {k: v for k, v in attributes.items() if v is not None})
        except Exception:  # pragma: no cover
            _log.debug("could not add span event", exc_info=True)


def _usage_attributes(usage: Usage) -> dict[str, Any]:
    total_input = usage.total_input_tokens
    return {
        "gen_ai.usage.input_tokens": total_input,
        "gen_ai.usage.output_tokens": usage.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": usage.cache_read_input_tokens,
        "gen_ai.usage.cache_write.input_tokens": usage.cache_creation_input_tokens,
        "gen_ai.usage.cache_creation.input_tokens": usage.cache_creation_input_tokens,
        "llm.token_count.prompt": total_input,
        "llm.token_count.completion": usage.output_tokens,
        "llm.token_count.total": total_input + usage.output_tokens,
        "llm.token_count.prompt_details.cache_read": usage.cache_read_input_tokens,
        "llm.token_count.prompt_details.cache_write": usage.cache_creation_input_tokens,
    }
