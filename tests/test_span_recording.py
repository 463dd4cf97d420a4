"""What a model call's and a tool call's spans carry, and what is built for a span that
records nothing: the same attributes, in the same order, whatever the sampler does (by
default without the OpenInference keys Phoenix derives; all of them when asked); no
attribute work (captured message content included) for a span the sampler drops or a no-op
tracer starts; the sampling decision still current for whatever runs inside. A run's own
spend on its ``invoke_agent`` span: summed as its calls commit, from the store only for a
resumed run (whose earlier calls were committed by another drive), never for no span."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
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

from anabranch import Agent, ModelRequest, RetryPolicy, Runtime, tool
from anabranch.errors import ModelConnectionError, ModelError, UserError
from anabranch.messages import (
    Message,
    ModelResponse,
    SystemBlock,
    TextBlock,
    ToolUseBlock,
    Usage,
)
from anabranch.store.sqlite import SQLiteStore
from anabranch.testing import FunctionModel
from anabranch.traces import Tracing, _payloads, _spans

from .helpers import attributes, failed_with

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
DERIVED = {  # what Phoenix derives from the GenAI names (tests/test_phoenix_e2e.py checks)
    "openinference.span.kind",
    "session.id",
    "llm.model_name",
    "llm.provider",
    "llm.system",
    "llm.token_count.prompt",
    "llm.token_count.completion",
    "llm.token_count.total",
    "llm.token_count.prompt_details.cache_read",
    "llm.token_count.prompt_details.cache_write",
    "tool.name",
    "tool.id",
}


def _minimal(pairs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in pairs if k not in DERIVED]


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
        wrapped = counted(name, getattr(_payloads, name))
        for module in (_spans, _payloads):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, wrapped)
    yield calls


@pytest.fixture
def sums(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The runs whose own usage the SQLite store was asked to sum, in order (a session's
    result sums the whole session's: not counted)."""
    asked: list[str] = []
    original = SQLiteStore.sum_call_usage

    async def counted(
        self: SQLiteStore, session_id: str, keys: Sequence[str], *, run_id: str | None = None
    ) -> dict[str, int]:
        if run_id is not None:
            asked.append(run_id)
        return await original(self, session_id, keys, run_id=run_id)

    monkeypatch.setattr(SQLiteStore, "sum_call_usage", counted)
    return asked


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
    assert list(attributes(chat).items()) == _minimal(CHAT + RESPONSE)
    assert list(attributes(tool).items()) == _minimal(TOOL)
    assert tool.status.status_code is StatusCode.ERROR


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_full_openinference_adds_every_derived_key_in_place(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, exporter = _provider()
    if how == "argument":
        monkeypatch.setenv("ANABRANCH_OPENINFERENCE", "minimal")  # the argument wins
        tracing = Tracing(provider, capture_content=False, openinference="full")
    else:
        monkeypatch.setenv("ANABRANCH_OPENINFERENCE", " Full ")
        tracing = Tracing(provider, capture_content=False)
    _one_call(tracing)
    chat, tool = exporter.get_finished_spans()
    assert list(attributes(chat).items()) == CHAT + RESPONSE  # round 5's set, in its order
    assert list(attributes(tool).items()) == TOOL


@pytest.mark.parametrize("value", ["all", "true", "phoenix"])
def test_an_unknown_openinference_choice_is_a_one_line_error(
    value: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    refused = f"openinference must be one of minimal, full, not '{value}'"
    with pytest.raises(UserError, match=refused):
        Runtime(tmp_path / "s.db", openinference=value)  # type: ignore[arg-type]
    monkeypatch.setenv("ANABRANCH_OPENINFERENCE", value)
    with pytest.raises(UserError, match="ANABRANCH_OPENINFERENCE must be one of minimal, full"):
        Runtime(tmp_path / "s.db")
    assert not (tmp_path / "s.db").exists()  # refused before anything was opened
    monkeypatch.setenv("ANABRANCH_OPENINFERENCE", "")
    assert not Tracing(NoOpTracerProvider()).openinference_full


def test_captured_content_is_set_with_the_attributes_of_a_recording_span(
    encodings: list[str],
) -> None:
    provider, exporter = _provider()
    _one_call(Tracing(provider, capture_content=True))
    chat, tool = exporter.get_finished_spans()
    chat_keys = [k for k, _ in CHAT] + CHAT_CONTENT + [k for k, _ in RESPONSE] + RESPONSE_CONTENT
    assert list(attributes(chat)) == [k for k in chat_keys if k not in DERIVED]
    assert list(attributes(tool)) == [k for k, _ in _minimal(TOOL[:-2])] + TOOL_CONTENT + [
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


@tool
def measure(text: str) -> int:
    """Count words."""
    return len(text.split())


AGENT = Agent(name="worker", model="claude-sonnet-4-5", instructions="Count.", tools=[measure])
FIRST = Usage(input_tokens=100, cache_read_input_tokens=30, output_tokens=10)
RETRIED = Usage(input_tokens=7, cache_creation_input_tokens=5, output_tokens=3)


def _answer(request: ModelRequest) -> ModelResponse:
    if len(request.messages) == 1:
        content: Any = (ToolUseBlock(id="toolu_1", name="measure", input={"text": "a b"}),)
        return ModelResponse(id="m1", model="claude-sonnet-4-5", content=content,
                             stop_reason="tool_use", usage=FIRST)  # fmt: skip
    return ModelResponse(id="m2", model="claude-sonnet-4-5", content=(TextBlock(text="2"),),
                         stop_reason="end_turn", usage=RETRIED)  # fmt: skip


def _spend(span: Any) -> tuple[int, int, int, int]:
    a = attributes(span)
    return (
        int(a["anabranch.usage.input_tokens"]),
        int(a["anabranch.usage.cache_read_input_tokens"]),
        int(a["anabranch.usage.cache_creation_input_tokens"]),
        int(a["anabranch.usage.output_tokens"]),
    )


def _flaky(failures: int) -> Callable[[ModelRequest], ModelResponse]:
    """The answers of ``_answer``; the second call's first ``failures`` attempts fail."""
    left = [failures]

    def answer(request: ModelRequest) -> ModelResponse:
        if len(request.messages) > 1 and left[0] > 0:
            left[0] -= 1
            raise ModelConnectionError("network down")  # a failed attempt spends nothing
        return _answer(request)

    return answer


def _runtime(path: Path, provider: Any, model: FunctionModel, attempts: int) -> Runtime:
    retry = RetryPolicy(max_attempts=attempts, base_delay=0.0)
    return Runtime(path, model=model, tracer_provider=provider, retry=retry)


@pytest.mark.anyio
async def test_a_fresh_run_spends_what_its_committed_calls_used_without_a_query(
    tmp_path: Path, sums: list[str]
) -> None:
    provider, exporter = _provider()
    model = FunctionModel(_flaky(1))
    async with _runtime(tmp_path / "s.db", provider, model, attempts=2) as rt:
        result = await rt.run(AGENT, "count")
        assert result.status == "done" and len(model.requests) == 3
        assert sums == []  # nothing summed by the store for the span
        (run,) = await rt.store.list_runs(result.session_id)
        keys = tuple(Usage.model_fields)
        stored = Usage(**await rt.store.sum_call_usage(result.session_id, keys, run_id=run.id))
    (agent,) = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent worker"]
    both = FIRST + RETRIED
    assert stored == both  # what the store holds for its successful calls
    assert _spend(agent) == (both.total_input_tokens, 30, 5, 13)


@pytest.mark.anyio
async def test_a_resumed_run_spends_the_calls_of_its_earlier_drives_too(
    tmp_path: Path, sums: list[str]
) -> None:
    provider, exporter = _provider()
    async with _runtime(tmp_path / "s.db", provider, FunctionModel(_flaky(1)), 1) as rt:
        failure = failed_with(await rt.run(AGENT, "count"), ModelError)
        assert failure.session_id is not None
        result = await rt.resume(failure.session_id)
        assert result.status == "done"
    first, second = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent worker"]
    assert "anabranch.usage.input_tokens" not in attributes(first)  # it failed: no spend
    both = FIRST + RETRIED
    assert _spend(second) == (both.total_input_tokens, 30, 5, 13)
    assert len(sums) == 1  # its first call was committed by the earlier drive: summed


@pytest.mark.anyio
@pytest.mark.parametrize("dropped", [True, False], ids=["sampled-out", "no-op"])
async def test_no_spend_is_summed_for_a_run_whose_span_records_nothing(
    tmp_path: Path, sums: list[str], dropped: bool
) -> None:
    provider = _provider(ALWAYS_OFF)[0] if dropped else NoOpTracerProvider()
    async with _runtime(tmp_path / "s.db", provider, FunctionModel(_flaky(1)), 1) as rt:
        failure = failed_with(await rt.run(AGENT, "count"), ModelError)
        assert failure.session_id is not None
        assert (await rt.resume(failure.session_id)).status == "done"
    assert sums == []  # a resumed run, yet nothing to sum for
