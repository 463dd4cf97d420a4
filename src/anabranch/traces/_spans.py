"""Spans for agent runs, model calls and tool calls; ``Tracing``, the one class that makes
every span (those of compactions, memory and limits come from ``_upkeep_spans``).

Only the OpenTelemetry API is used: without an SDK every span is a no-op. Telemetry never
raises into a run: attribute and event helpers swallow their own errors.

Attributes follow the OpenTelemetry GenAI semantic conventions (``gen_ai.*``), plus the
OpenInference keys Arize Phoenix cannot derive from those (``openinference.span.kind`` of
compaction, graph and memory spans, ``input.value``/``output.value``); ``openinference=
"full"`` adds the ones it derives (span kinds, ``session.id``, ``llm.*``, ``tool.*``) for
other OpenInference backends (see ``_settings``). Message content is recorded only when
opted in.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from anabranch.messages import (
    Document,
    Image,
    Message,
    SystemBlock,
    Usage,
)
from anabranch.traces._current import (
    NO_ATTRIBUTES,
    CurrentSpan,
    links_or_none,
    safe_set,
    sampler_keeps_attributes,
    set_all,
    set_one,
)
from anabranch.traces._payloads import (
    arguments_content,
    compact_json,
    message_json,
    message_parts,
    request_content,
    usage_attributes,
)
from anabranch.traces._settings import (
    PROVIDER,
    OpenInference,
    content_capture_from_env,
    openinference_full,
)
from anabranch.traces._upkeep_spans import (
    compact_span,
    compaction_manifest,
    compaction_result,
    limit_reached,
    limit_soft,
    memory_result,
    memory_span,
)

__all__ = ["SpanRef", "Tracing"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpanRef:
    """The ids of one span as lowercase hex, as stored and as shown by trace UIs."""

    trace_id: str
    span_id: str


def _links(refs: Sequence[SpanRef]) -> list[Link]:
    links = []
    for ref in refs:
        try:
            context = SpanContext(
                trace_id=int(ref.trace_id, 16),
                span_id=int(ref.span_id, 16),
                is_remote=True,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
        except ValueError:
            continue
        if context.is_valid:
            links.append(Link(context, {"anabranch.link.type": "resumed_from"}))
    return links


class Tracing:
    """Creates anabranch's spans on a tracer (default: the global provider's).

    Args:
        tracer_provider: where spans go; default the global provider (a no-op without SDK).
        capture_content: record prompts, outputs, tool arguments and results; default off,
            or on when ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` says so.
        openinference: ``"minimal"`` (default, or ``$ANABRANCH_OPENINFERENCE``): only the
            OpenInference keys Phoenix cannot derive from the GenAI ones; ``"full"``: all.
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        *,
        capture_content: bool | None = None,
        openinference: OpenInference | None = None,
    ) -> None:
        provider = tracer_provider or trace.get_tracer_provider()
        self._tracer = provider.get_tracer("anabranch")
        self._records = not isinstance(self._tracer, trace.NoOpTracer)
        """False for a no-op tracer: its spans never record, so the hot spans build no
        attributes for it (a proxy for the global provider may record later: it counts)."""
        self._at_start = sampler_keeps_attributes(self._tracer)
        """Whether a span's first attributes can go to ``start_span`` (see ``CurrentSpan``)."""
        self.capture_content = (
            content_capture_from_env() if capture_content is None else capture_content
        )
        self.openinference_full: Final = openinference_full(openinference)
        """Every OpenInference key, those Phoenix derives from the GenAI names too."""

    def _span(
        self,
        name: str,
        kind: SpanKind,
        attributes: Mapping[str, Any],
        links: Sequence[Link] = (),
    ) -> CurrentSpan:
        """A current span; if the SDK or a span processor fails, the run goes on without it.

        ``None`` values are left out (the hot spans build theirs without any instead)."""
        if not self._records:
            return CurrentSpan(self._tracer, name, kind, NO_ATTRIBUTES)
        kept = {k: v for k, v in attributes.items() if v is not None}
        return CurrentSpan(
            self._tracer, name, kind, kept, links_or_none(links), at_start=self._at_start
        )

    @staticmethod
    def span_ref(span: Span) -> SpanRef | None:
        """The span's ids, or None when nothing is recorded (no SDK, not sampled)."""
        try:
            context = span.get_span_context()
            if not context.is_valid or not span.is_recording():
                return None
            return SpanRef(
                trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id)
            )
        except Exception:  # pragma: no cover
            return None

    # ------------------------------------------------------------------ agents
    def agent_run(
        self,
        *,
        agent: str,
        run_id: str,
        session_id: str,
        model: str,
        task: str,
        resumed_from: Sequence[SpanRef] = (),
    ) -> CurrentSpan:
        """``invoke_agent {agent}``: one drive of one agent run.

        ``resumed_from`` are the spans of earlier drives of the same run (the run was
        resumed); the new span links to them, so a resumed session's trace points back.
        """
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.agent.name": agent,
            "gen_ai.agent.id": run_id,
            "gen_ai.conversation.id": session_id,
            "gen_ai.request.model": model,
        }
        if self.openinference_full:
            attributes["openinference.span.kind"] = "AGENT"
            attributes["session.id"] = session_id
        attributes["agent.name"] = agent
        if resumed_from:
            attributes["anabranch.resumed"] = True
        if self.capture_content:
            attributes["input.value"] = task
            attributes["input.mime_type"] = "text/plain"
        return self._span(
            f"invoke_agent {agent}", SpanKind.INTERNAL, attributes, _links(resumed_from)
        )

    def graph_run(
        self,
        *,
        graph: str,
        session_id: str,
        tasks: int,
        resumed_from: Sequence[SpanRef] = (),
    ) -> CurrentSpan:
        """The span of a task graph: every task's ``invoke_agent`` span nests under it.

        ``resumed_from``: the graph's spans from earlier drives of the session (links).
        """
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_workflow",
            "gen_ai.conversation.id": session_id,
            "openinference.span.kind": "CHAIN",  # Phoenix has no kind for invoke_workflow
        }
        if self.openinference_full:
            attributes["session.id"] = session_id
        attributes["anabranch.graph.name"] = graph
        attributes["anabranch.graph.tasks"] = tasks
        if resumed_from:
            attributes["anabranch.resumed"] = True
        return self._span(
            f"invoke_workflow {graph}", SpanKind.INTERNAL, attributes, _links(resumed_from)
        )

    def agent_spend(self, span: Span, usage: Usage, cost: float | None) -> None:
        """A run's own spend on its ``invoke_agent`` span (its sub-agents have theirs):
        ``anabranch.`` names only, so UIs that sum the LLM spans do not count it twice."""
        safe_set(
            span,
            {
                "anabranch.usage.input_tokens": usage.total_input_tokens,
                "anabranch.usage.cache_read_input_tokens": usage.cache_read_input_tokens,
                "anabranch.usage.cache_creation_input_tokens": usage.cache_creation_input_tokens,
                "anabranch.usage.output_tokens": usage.output_tokens,
                "anabranch.cost.usd": cost,
            },
        )

    def agent_output(self, span: Span, output: str, usage: Usage | None = None) -> None:
        attributes: dict[str, Any] = {}
        if self.capture_content:
            attributes["output.value"] = output
            attributes["output.mime_type"] = "text/plain"
        if usage is not None:
            usage_attributes(usage, attributes, full=self.openinference_full)
        if attributes:  # (without content capture or usage there is nothing to set)
            safe_set(span, attributes)

    # ------------------------------------------------------------------ model calls
    def model_call(
        self,
        *,
        model: str,
        session_id: str,
        agent: str,
        attempt: int,
        compacted: bool,
        messages: tuple[Message, ...] | None = None,
        system: Sequence[SystemBlock] | None = None,
        purpose: str | None = None,
    ) -> CurrentSpan:
        """``chat {model}``: the one inference span of one model call attempt.

        The anthropic SDK's own spans are turned off (see ``AnthropicModel``), so this is the
        only inference span. ``purpose`` marks calls that are not agent turns (``compaction``).
        """
        name = f"chat {model}"
        if not self._records:
            return CurrentSpan(self._tracer, name, SpanKind.CLIENT, NO_ATTRIBUTES)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.request.model": model,
            "gen_ai.conversation.id": session_id,
            "gen_ai.agent.name": agent,
        }
        if self.openinference_full:
            attributes["openinference.span.kind"] = "LLM"
            attributes["session.id"] = session_id
            attributes["llm.model_name"] = model
            attributes["llm.provider"] = PROVIDER
            attributes["llm.system"] = PROVIDER
        attributes["anabranch.attempt"] = attempt
        if purpose is not None:
            attributes["anabranch.call.purpose"] = purpose
        if compacted:
            attributes["gen_ai.conversation.compacted"] = True
        more = None
        if self.capture_content and messages is not None:
            more = partial(request_content, messages, system)  # built only if it records
        return CurrentSpan(
            self._tracer, name, SpanKind.CLIENT, attributes, None, more, self._at_start
        )

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
        if not span.is_recording():
            return
        attributes: dict[str, Any] = {
            "gen_ai.response.id": response_id,
            "gen_ai.response.model": response_model,
            "gen_ai.response.finish_reasons": [stop_reason or "unknown"],
        }
        usage_attributes(usage, attributes, full=self.openinference_full)
        if self.capture_content and output is not None:
            attributes["gen_ai.output.messages"] = compact_json(
                [
                    {
                        "role": output.role,
                        "parts": message_parts(output),
                        "finish_reason": stop_reason or "unknown",
                    }
                ]
            )
            attributes["output.value"] = compact_json(message_json(output))
            attributes["output.mime_type"] = "application/json"
        set_all(span, attributes)

    def model_error(self, span: Span, error: BaseException) -> None:
        """Mark an inference span as failed (a retried attempt ends without raising)."""
        safe_set(span, {"error.type": type(error).__name__})
        try:
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        except Exception:  # pragma: no cover
            _log.debug("could not set span status", exc_info=True)

    def retry_scheduled(self, error: BaseException, delay: float, attempt: int) -> None:
        """An ``anabranch.retry`` event on the current span: a failed attempt will be retried."""
        self.event(
            trace.get_current_span(),
            "anabranch.retry",
            {
                "error.type": type(error).__name__,
                "anabranch.retry.delay": delay,
                "anabranch.attempt": attempt,
            },
        )

    # ------------------------------------------------------------------ tools
    def tool_call(
        self,
        *,
        tool: str,
        call_id: str,
        session_id: str,
        description: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> CurrentSpan:
        """``execute_tool {tool}``; a spawned agent's ``invoke_agent`` span nests under it."""
        name = f"execute_tool {tool}"
        if not self._records:
            return CurrentSpan(self._tracer, name, SpanKind.INTERNAL, NO_ATTRIBUTES)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function",
        }
        if description:
            attributes["gen_ai.tool.description"] = description
        attributes["gen_ai.conversation.id"] = session_id
        if self.openinference_full:
            attributes["openinference.span.kind"] = "TOOL"
            attributes["session.id"] = session_id
            attributes["tool.name"] = tool
            attributes["tool.id"] = call_id
        more = None
        if self.capture_content and arguments is not None:
            more = partial(arguments_content, arguments)  # built only if it records
        return CurrentSpan(
            self._tracer, name, SpanKind.INTERNAL, attributes, None, more, self._at_start
        )

    def tool_result(
        self,
        span: Span,
        content: str,
        is_error: bool,
        attachments: Sequence[Image | Document] = (),
    ) -> None:
        """A tool's outcome; its images and documents by kind and size only, always."""
        if is_error:
            try:
                span.set_status(Status(StatusCode.ERROR))
            except Exception:  # pragma: no cover
                _log.debug("could not set span status", exc_info=True)
        if not span.is_recording():
            return
        if not (is_error or attachments or self.capture_content):  # the usual outcome
            set_one(span, "anabranch.tool.is_error", False)
            return
        attributes: dict[str, Any] = {"anabranch.tool.is_error": is_error}
        if attachments:
            attributes["anabranch.tool.attachments"] = [
                f"{a.type} {a.media_type} {'url' if a.url else f'{a.size} bytes'}"
                for a in attachments
            ]
        if is_error:
            attributes["error.type"] = "tool_error"
        if self.capture_content:
            attributes["gen_ai.tool.call.result"] = content
            attributes["output.value"] = content
            attributes["output.mime_type"] = "text/plain"
        set_all(span, attributes)

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
        safe_set(target, {"anabranch.cache.break.cause": cause})

    # ------------------------------------------------------------------ upkeep
    # compactions, memory, limits: functions of a ``Tracing`` in ``_upkeep_spans``
    compact_span = compact_span
    compaction_result = compaction_result
    compaction_manifest = compaction_manifest
    memory_span = memory_span
    memory_result = memory_result
    limit_soft = limit_soft
    limit_reached = limit_reached

    # ------------------------------------------------------------------ misc
    def event(self, span: Span, name: str, attributes: Mapping[str, Any]) -> None:
        try:
            span.add_event(name, {k: v for k, v in attributes.items() if v is not None})
        except Exception:  # pragma: no cover
            _log.debug("could not add span event", exc_info=True)
