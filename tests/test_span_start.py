"""How a span gets its attributes: at ``start_span`` when the tracer's sampler is built of the
SDK's own samplers (which hand them back to the span), so the sampler and every processor's
``on_start`` see them; right after the start for any other sampler, which may hand back
none. Either way the finished span carries the same attributes in the same order, and a
successful tool call's outcome is its one ``anabranch.tool.is_error``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    DEFAULT_ON,
    Decision,
    ParentBased,
    ParentBasedTraceIdRatio,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, NoOpTracerProvider, SpanKind, StatusCode, TraceState
from opentelemetry.util.types import Attributes

from anabranch.traces import Tracing
from anabranch.traces._current import sampler_keeps_attributes

from .helpers import attributes

CHAT_START = [
    ("gen_ai.operation.name", "chat"),
    ("gen_ai.provider.name", "anthropic"),
    ("gen_ai.request.model", "m1"),
    ("gen_ai.conversation.id", "s1"),
    ("gen_ai.agent.name", "a1"),
    ("anabranch.attempt", 1),
]
TOOL_START = [
    ("gen_ai.operation.name", "execute_tool"),
    ("gen_ai.tool.name", "note"),
    ("gen_ai.tool.call.id", "toolu_1"),
    ("gen_ai.tool.type", "function"),
    ("gen_ai.conversation.id", "s1"),
]


class _Seen(SpanProcessor):
    """What each span carried when the processors were told it started."""

    def __init__(self) -> None:
        self.at_start: dict[str, list[tuple[str, Any]]] = {}

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.at_start[span.name] = list(attributes(span).items())

    def on_end(self, span: ReadableSpan) -> None:
        pass


class _Asking(Sampler):
    """Samples everything; remembers the attributes it is given; hands back its own only."""

    def __init__(self) -> None:
        self.given: list[dict[str, Any]] = []

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        self.given.append(dict(attributes or {}))
        return SamplingResult(Decision.RECORD_AND_SAMPLE, {"sampler.rule": "all"})

    def get_description(self) -> str:
        return "Asking"


def _traced(sampler: Sampler | None) -> tuple[Tracing, InMemorySpanExporter, _Seen]:
    exporter, seen = InMemorySpanExporter(), _Seen()
    provider = TracerProvider(sampler=sampler, shutdown_on_exit=False)
    provider.add_span_processor(seen)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider, capture_content=False), exporter, seen


def _call_and_tool(tracing: Tracing) -> None:
    with tracing.model_call(model="m1", session_id="s1", agent="a1", attempt=1, compacted=False):
        pass
    with tracing.tool_call(tool="note", call_id="toolu_1", session_id="s1") as span:
        tracing.tool_result(span, "noted", False)


@pytest.mark.parametrize(
    ("sampler", "keeps"),
    [
        (None, True),  # the SDK's default: ParentBased(ALWAYS_ON)
        (DEFAULT_ON, True),
        (ALWAYS_ON, True),
        (ALWAYS_OFF, True),
        (TraceIdRatioBased(0.5), True),
        (ParentBasedTraceIdRatio(0.25), True),
        (ParentBased(ALWAYS_ON, local_parent_sampled=TraceIdRatioBased(0.5)), True),
        (_Asking(), False),
        (ParentBased(_Asking()), False),
        (ParentBased(ALWAYS_ON, local_parent_not_sampled=_Asking()), False),
    ],
)
def test_only_the_sdks_own_samplers_are_known_to_keep_the_attributes(
    sampler: Sampler | None, keeps: bool
) -> None:
    provider = TracerProvider(sampler=sampler, shutdown_on_exit=False)
    assert sampler_keeps_attributes(provider.get_tracer("t")) is keeps


def test_a_tracer_that_is_not_the_sdks_is_not_known_to_keep_them() -> None:
    assert not sampler_keeps_attributes(NoOpTracerProvider().get_tracer("t"))
    assert not sampler_keeps_attributes(trace.ProxyTracerProvider().get_tracer("t"))


def test_with_the_default_sampler_processors_see_the_attributes_at_start() -> None:
    tracing, exporter, seen = _traced(None)
    _call_and_tool(tracing)
    assert seen.at_start == {"chat m1": CHAT_START, "execute_tool note": TOOL_START}
    chat, tool = exporter.get_finished_spans()
    assert list(attributes(chat).items()) == CHAT_START
    assert list(attributes(tool).items()) == [*TOOL_START, ("anabranch.tool.is_error", False)]
    assert tool.status.status_code is StatusCode.UNSET


def test_a_hand_written_sampler_keeps_its_attributes_and_the_span_gets_all_of_ours() -> None:
    sampler = _Asking()
    tracing, exporter, seen = _traced(sampler)
    _call_and_tool(tracing)
    assert seen.at_start == {
        "chat m1": [("sampler.rule", "all")],
        "execute_tool note": [("sampler.rule", "all")],
    }
    chat, tool = exporter.get_finished_spans()
    assert list(attributes(chat).items()) == [("sampler.rule", "all"), *CHAT_START]
    assert list(attributes(tool).items()) == [
        ("sampler.rule", "all"),
        *TOOL_START,
        ("anabranch.tool.is_error", False),
    ]
