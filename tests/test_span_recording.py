"""What a model call's and a tool call's spans carry, and what is built for a span that
records nothing: the same attributes, in the same order, whatever the sampler does; no
attribute work (captured message content included) for a span the sampler drops or a no-op
tracer starts; the sampling decision still current for whatever runs inside."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, NoOpTracerProvider, SpanKind, StatusCode, TraceState
from opentelemetry.util.types import Attributes

from anabranch.messages import Message, SystemBlock, TextBlock, ToolUseBlock, Usage
from anabranch.traces import Tracing, _payloads, _spans

from .helpers import attributes

MESSAGES = (Message(role="user", content=(TextBlock(text="hello"),)),)
SYSTEM = (SystemBlock(text="be brief"),)
OUTPUT = Message(
    role="assistant",
    content=(ToolUseBlock(id="toolu_1", name="note", input={"text": "hi"}),),
)
USAGE = Usage(
    input_tokens=5,
    output_tokens=3,
    cache_read_input_tokens=7,
    cache_creation_input_tokens=2,
    thinking_tokens=1,
)

CHAT = [
    ("gen_ai.operation.name", "chat"),
    ("gen_ai.provider.name", "anthropic"),
    ("gen_ai.request.model", "m1"),
    ("gen_ai.conversation.id", "s1"),
    ("gen_ai.agent.name", "a1"),
    ("openinference.span.kind", "LLM"),
    ("session.id", "s1"),
    ("llm.model_name", "m1"),
    ("llm.provider", "anthropic"),
    ("llm.system", "anthropic"),
    ("anabranch.attempt", 2),
    ("anabranch.call.purpose", "compaction"),
    ("gen_ai.conversation.compacted", True),
]
RESPONSE = [
    ("gen_ai.response.id", "msg_1"),
    ("gen_ai.response.model", "m1-x"),
    ("gen_ai.response.finish_reasons", ("tool_use",)),
    ("gen_ai.usage.input_tokens", 14),
    ("gen_ai.usage.output_tokens", 3),
    ("gen_ai.usage.cache_read.input_tokens", 7),
    ("gen_ai.usage.cache_write.input_tokens", 2),
    ("gen_ai.usage.cache_creation.input_tokens", 2),
    ("llm.token_count.prompt", 14),
    ("llm.token_count.completion", 3),
    ("llm.token_count.total", 17),
    ("llm.token_count.prompt_details.cache_read", 7),
    ("llm.token_count.prompt_details.cache_write", 2),
    ("gen_ai.usage.reasoning.output_tokens", 1),
    ("llm.token_count.completion_details.reasoning", 1),
]
TOOL = [
    ("gen_ai.operation.name", "execute_tool"),
    ("gen_ai.tool.name", "note"),
    ("gen_ai.tool.call.id", "toolu_1"),
    ("gen_ai.tool.type", "function"),
    ("gen_ai.tool.description", "Notes."),
    ("gen_ai.conversation.id", "s1"),
    ("openinference.span.kind", "TOOL"),
    ("session.id", "s1"),
    ("tool.name", "note"),
    ("tool.id", "toolu_1"),
    ("anabranch.tool.is_error", True),
    ("error.type", "tool_error"),
]
CHAT_CONTENT = ["gen_ai.input.messages", "input.value", "input.mime_type"]
CHAT_CONTENT += ["gen_ai.system_instructions"]
RESPONSE_CONTENT = ["gen_ai.output.messages", "output.value", "output.mime_type"]
TOOL_CONTENT = ["gen_ai.tool.call.arguments", "input.value", "input.mime_type"]
TOOL_RESULT_CONTENT = ["gen_ai.tool.call.result", "output.value", "output.mime_type"]


class _Forgetful(Sampler):
    """Samples everything and hands back no attributes (as a hand-written sampler may)."""

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
        return SamplingResult(Decision.RECORD_AND_SAMPLE)

    def get_description(self) -> str:
        return "Forgetful"


@pytest.fixture
def encodings(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the content encoders called (message parts, message JSON, JSON)."""
    calls: list[str] = []

    def counted(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return function(*args, **kwargs)

        return wrapper

    for name in ("compact_json", "message_json", "message_parts", "semconv_messages"):
        monkeypatch.setattr(_spans, name, counted(name, getattr(_payloads, name)))
    yield calls


def _provider(sampler: Sampler | None = None) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler, shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _one_call(tracing: Tracing, inside: Callable[[trace.Span], None] | None = None) -> None:
    """The spans of one model call and its tool call, as the loop makes them."""
    with tracing.model_call(
        model="m1",
        session_id="s1",
        agent="a1",
        attempt=2,
        compacted=True,
        messages=MESSAGES,
        system=SYSTEM,
        purpose="compaction",
    ) as span:
        if inside is not None:
            inside(span)
        tracing.model_response(
            span,
            response_id="msg_1",
            response_model="m1-x",
            stop_reason="tool_use",
            usage=USAGE,
            output=OUTPUT,
        )
    with tracing.tool_call(
        tool="note",
        call_id="toolu_1",
        session_id="s1",
        description="Notes.",
        arguments={"text": "hi"},
    ) as span:
        tracing.tool_result(span, "noted", True)


@pytest.mark.parametrize("sampler", [None, _Forgetful()], ids=["default", "forgetful"])
def test_chat_and_tool_spans_carry_their_attributes_in_order(sampler: Sampler | None) -> None:
    provider, exporter = _provider(sampler)
    _one_call(Tracing(provider, capture_content=False))
    chat, tool = exporter.get_finished_spans()
    assert list(attributes(chat).items()) == CHAT + RESPONSE
    assert list(attributes(tool).items()) == TOOL
    assert tool.status.status_code is StatusCode.ERROR


def test_captured_content_is_set_with_the_attributes_of_a_recording_span(
    encodings: list[str],
) -> None:
    provider, exporter = _provider()
    _one_call(Tracing(provider, capture_content=True))
    chat, tool = exporter.get_finished_spans()
    chat_keys = [k for k, _ in CHAT] + CHAT_CONTENT + [k for k, _ in RESPONSE] + RESPONSE_CONTENT
    assert list(attributes(chat)) == chat_keys
    assert list(attributes(tool)) == [k for k, _ in TOOL[:-2]] + TOOL_CONTENT + [
        "anabranch.tool.is_error",
        "error.type",
        *TOOL_RESULT_CONTENT,
    ]
    a = attributes(tool)
    assert a["gen_ai.tool.call.arguments"] == a["input.value"] == '{"text":"hi"}'
    assert "semconv_messages" in encodings and "message_json" in encodings


def test_a_span_the_sampler_drops_gets_nothing_built_but_stays_current(
    encodings: list[str],
) -> None:
    provider, exporter = _provider(ALWAYS_OFF)
    tracing = Tracing(provider, capture_content=True)
    seen: list[trace.Span] = []

    def inside(span: trace.Span) -> None:
        assert not span.is_recording()
        assert trace.get_current_span() is span  # its ids and decision reach what runs inside
        with provider.get_tracer("user").start_as_current_span("user work") as child:
            seen.append(child)

    _one_call(tracing, inside)
    assert exporter.get_finished_spans() == ()
    assert encodings == []  # no message content encoded for a span nobody will see
    (child,) = seen
    assert not child.is_recording()  # the drop decision was inherited, not taken anew


def test_a_no_op_tracer_builds_nothing_and_keeps_the_callers_span_current(
    encodings: list[str],
) -> None:
    outer_provider, outer_exporter = _provider()
    tracing = Tracing(NoOpTracerProvider(), capture_content=True)
    with outer_provider.get_tracer("app").start_as_current_span("app request") as outer:

        def inside(span: trace.Span) -> None:
            assert not span.is_recording()
            current = trace.get_current_span().get_span_context()
            assert current.span_id == outer.get_span_context().span_id

        _one_call(tracing, inside)
    assert encodings == []
    (app,) = outer_exporter.get_finished_spans()
    assert app.name == "app request" and not app.events and not app.attributes


def test_content_that_cannot_be_encoded_leaves_the_span_without_it() -> None:
    provider, exporter = _provider()
    tracing = Tracing(provider, capture_content=True)
    ran = False
    with tracing.tool_call(
        tool="note", call_id="toolu_1", session_id="s1", arguments={"when": object()}
    ) as span:
        ran = True
        assert span.is_recording()
        tracing.tool_result(span, "noted", False)
    assert ran
    (tool,) = exporter.get_finished_spans()
    a = attributes(tool)
    assert a["gen_ai.tool.call.id"] == "toolu_1" and a["gen_ai.tool.call.result"] == "noted"
    assert "gen_ai.tool.call.arguments" not in a
