"""Span tree, attributes and parentage of offline runs, checked with the in-memory exporter."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, format_span_id, format_trace_id

from anabranch import Agent, AnthropicModel, ModelRequest, RetryPolicy, Runtime, ToolContext, tool
from anabranch.errors import ModelConnectionError, ModelError
from anabranch.messages import ModelResponse, TextBlock, ToolUseBlock, Usage
from anabranch.testing import FunctionModel, TestModel
from anabranch.traces import OpenInference

from .helpers import attributes, failed_with, sql
from .span_fixtures import span_exporter, span_provider  # noqa: F401

pytestmark = pytest.mark.anyio

TASK_SECRET = "task-text-7f3a"
TOOL_SECRET = "tool-output-91bc"


@tool
async def lookup(topic: str, ctx: ToolContext) -> str:
    """Look a topic up."""
    return f"{TOOL_SECRET} about {topic}"


@tool
def measure(text: str) -> int:
    """Count words."""
    return len(text.split())


worker = Agent(
    name="worker",
    model="claude-sonnet-4-5",
    instructions="Research and report.",
    tools=[lookup, measure],
)


def _hex(span: ReadableSpan) -> str:
    assert span.context is not None
    return format_span_id(span.context.span_id)


def _trace(span: ReadableSpan) -> str:
    assert span.context is not None
    return format_trace_id(span.context.trace_id)


def _parent(span: ReadableSpan) -> str | None:
    return format_span_id(span.parent.span_id) if span.parent is not None else None


def _all_text(spans: tuple[ReadableSpan, ...]) -> str:
    """Every attribute, event and link of every span, as one string."""
    parts: list[Any] = []
    for span in spans:
        parts.append(span.name)
        parts.extend(f"{k}={v}" for k, v in attributes(span).items())
        for event in span.events:
            parts.append(event.name)
            parts.extend(f"{k}={v}" for k, v in attributes(event).items())
        parts.append(span.status.description or "")
    return "\n".join(str(p) for p in parts)


async def _run(
    tmp_path: Path, provider: TracerProvider, model: Any = None, **options: Any
) -> tuple[str, Runtime]:
    rt = Runtime(
        db=tmp_path / "t.db",
        model=model or TestModel(rounds=2),
        tracer_provider=provider,
        **options,
    )
    await rt.open()
    result = await rt.run(worker, f"Study tracing {TASK_SECRET}")
    return result.session_id, rt


async def test_span_tree_shape_and_parentage(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    session_id, rt = await _run(tmp_path, provider)
    try:
        calls = await sql(
            rt.store,
            "SELECT c.id FROM calls c JOIN runs r ON r.id = c.run_id WHERE r.session_id = ?",
            (session_id,),
        )
        tool_calls = await sql(
            rt.store, "SELECT call_id, name FROM tool_events WHERE event = 'finished'"
        )
        runs = await rt.store.list_runs(session_id)
    finally:
        await rt.aclose()
    spans = exporter.get_finished_spans()
    agents = [s for s in spans if s.name == "invoke_agent worker"]
    chats = [s for s in spans if s.name == "chat claude-sonnet-4-5"]
    tools = [s for s in spans if s.name.startswith("execute_tool ")]
    assert len(agents) == 1 and len(runs) == 1
    root = agents[0]
    assert root.parent is None
    # exactly one inference span per model call (the SDK's own spans are off)
    assert len(chats) == len(calls) == 3
    assert len(spans) == 1 + len(chats) + len(tools)
    assert {_trace(s) for s in spans} == {_trace(root)}  # one trace per session
    assert all(_parent(s) == _hex(root) for s in chats + tools)
    assert sorted(attributes(s)["gen_ai.tool.call.id"] for s in tools) == sorted(
        t["call_id"] for t in tool_calls
    )
    assert sorted(s.name for s in tools) == sorted(f"execute_tool {t['name']}" for t in tool_calls)
    assert root.kind is SpanKind.INTERNAL and all(s.kind is SpanKind.CLIENT for s in chats)

    attrs = attributes(root)
    assert attrs["gen_ai.operation.name"] == "invoke_agent"  # Phoenix: kind AGENT
    assert attrs["gen_ai.agent.name"] == attrs["agent.name"] == "worker"
    assert attrs["gen_ai.agent.id"] == runs[0].id
    assert attrs["gen_ai.conversation.id"] == session_id  # Phoenix: its session.id
    assert attrs["gen_ai.provider.name"] == "anthropic"
    for chat in chats:
        c = attributes(chat)
        assert c["gen_ai.operation.name"] == "chat"  # Phoenix: kind LLM
        assert c["gen_ai.request.model"] == "claude-sonnet-4-5"
        assert c["gen_ai.conversation.id"] == session_id
        assert "gen_ai.conversation.compacted" not in c  # nothing was compacted
    for span in tools:
        t = attributes(span)
        assert t["gen_ai.operation.name"] == "execute_tool"  # Phoenix: kind TOOL
        assert t["gen_ai.tool.name"] == span.name.removeprefix("execute_tool ")
    # what Phoenix derives from those is not sent twice (openinference="full" does)
    derived = {"openinference.span.kind", "session.id", "llm.model_name", "tool.name"}
    assert all(not derived & set(attributes(s)) for s in spans)


@pytest.mark.parametrize("openinference", ["minimal", "full"])
async def test_usage_attributes_add_cache_tokens(
    tmp_path: Path,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    openinference: OpenInference,
) -> None:
    usage = Usage(
        input_tokens=11,
        output_tokens=7,
        cache_read_input_tokens=500,
        cache_creation_input_tokens=40,
    )

    def answer(request: ModelRequest) -> ModelResponse:
        return ModelResponse(
            id="msg_1",
            model="claude-sonnet-4-5-20990101",
            content=(TextBlock(text="done"),),
            stop_reason="end_turn",
            usage=usage,
        )

    _, rt = await _run(tmp_path, provider, FunctionModel(answer), openinference=openinference)
    await rt.aclose()
    (chat,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    a = attributes(chat)
    assert a["gen_ai.usage.input_tokens"] == 11 + 500 + 40
    assert a["gen_ai.usage.output_tokens"] == 7
    assert a["gen_ai.usage.cache_read.input_tokens"] == 500
    assert a["gen_ai.usage.cache_write.input_tokens"] == 40
    assert a["gen_ai.usage.cache_creation.input_tokens"] == 40  # former name, read by Phoenix
    assert a["llm.token_count.completion_details.reasoning"] == 0  # Phoenix does not derive it
    if openinference == "full":
        assert a["llm.token_count.prompt"] == 551
        assert a["llm.token_count.completion"] == 7
        assert a["llm.token_count.total"] == 558
        assert a["llm.token_count.prompt_details.cache_read"] == 500
        assert a["llm.token_count.prompt_details.cache_write"] == 40
    else:  # Phoenix derives them from the gen_ai.usage.* ones (tests/test_phoenix_e2e.py)
        assert not [k for k in a if k.startswith("llm.") and "reasoning" not in k]
    assert a["gen_ai.response.model"] == "claude-sonnet-4-5-20990101"
    assert a["gen_ai.response.finish_reasons"] == ("end_turn",)


async def test_message_content_is_off_by_default(
    tmp_path: Path,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", raising=False)
    _, rt = await _run(tmp_path, provider)
    await rt.aclose()
    spans = exporter.get_finished_spans()
    text = _all_text(spans)
    assert TASK_SECRET not in text
    assert TOOL_SECRET not in text
    for span in spans:
        keys = set(attributes(span))
        assert not keys & {"input.value", "output.value", "gen_ai.input.messages"}, span.name


@pytest.mark.parametrize("how", ["option", "env"])
async def test_message_content_opt_in(
    tmp_path: Path,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    options: dict[str, Any] = {}
    if how == "option":
        options["capture_content"] = True
    else:
        monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
    _, rt = await _run(tmp_path, provider, **options)
    await rt.aclose()
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.name.startswith("invoke_agent")]
    assert TASK_SECRET in str(attributes(root)["input.value"])
    chats = [s for s in spans if s.name.startswith("chat ")]
    first = json.loads(str(attributes(chats[0])["gen_ai.input.messages"]))
    assert first[0]["role"] == "user"
    assert TASK_SECRET in first[0]["parts"][0]["content"]
    lookups = [s for s in spans if s.name == "execute_tool lookup"]
    assert lookups and all(TOOL_SECRET in str(attributes(s)["output.value"]) for s in lookups)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_api_key_never_reaches_spans(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    key = "sk-ant-api03-SENTINEL-do-not-leak"
    model = AnthropicModel(api_key=key, base_url=f"http://127.0.0.1:{_closed_port()}", timeout=5)
    rt = Runtime(
        db=tmp_path / "t.db",
        model=model,
        tracer_provider=provider,
        capture_content=True,  # even with everything recorded
        retry=RetryPolicy(max_attempts=2, base_delay=0),
    )
    current = worker.model_copy(update={"model": "claude-opus-4-8"})  # not deprecated
    async with rt:
        failed_with(await rt.run(current, "anything"), ModelConnectionError)
    spans = exporter.get_finished_spans()
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert len(chats) == 2  # one span per attempt, each failed
    assert all(s.status.status_code is StatusCode.ERROR for s in chats)
    assert any(e.name == "exception" for s in chats for e in s.events)
    text = _all_text(spans)
    assert key not in text and "SENTINEL" not in text


class _Broken(SpanExporter):
    def export(self, spans: Any) -> SpanExportResult:
        raise RuntimeError("collector exploded")


class _BrokenProcessor(SimpleSpanProcessor):
    def on_start(self, span: Any, parent_context: Any = None) -> None:
        raise RuntimeError("processor exploded on start")

    def on_end(self, span: Any) -> None:
        raise RuntimeError("processor exploded on end")


async def test_broken_exporter_or_processor_does_not_affect_the_run(tmp_path: Path) -> None:
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(_Broken()))
    provider.add_span_processor(_BrokenProcessor(_Broken()))
    plain_rt = Runtime(db=tmp_path / "plain.db", model=TestModel(rounds=2))
    async with plain_rt:
        expected = (await plain_rt.run(worker, "same task")).output
    rt = Runtime(db=tmp_path / "t.db", model=TestModel(rounds=2), tracer_provider=provider)
    async with rt:
        result = await rt.run(worker, "same task")
        assert result.status == "done"
        assert result.output == expected
        assert (await rt.store.get_session(result.session_id)).status == "done"  # type: ignore[union-attr]


async def test_resumed_session_links_to_the_earlier_trace(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    answers = iter(["fail", "ok"])

    def flaky(request: ModelRequest) -> Any:
        if next(answers, "ok") == "fail":
            raise ModelConnectionError("network down")
        return (
            [ToolUseBlock(id="toolu_1", name="measure", input={"text": "a b c"})]
            if len(request.messages) == 1
            else "final"
        )

    rt = Runtime(
        db=tmp_path / "t.db",
        model=FunctionModel(flaky),
        tracer_provider=provider,
        retry=RetryPolicy(max_attempts=1),
    )
    async with rt:
        failure = failed_with(await rt.run(worker, "task"), ModelError)
        session_id = failure.session_id
        assert session_id is not None
        first = exporter.get_finished_spans()
        result = await rt.resume(session_id)
    assert result.status == "done" and result.output == "final"
    second = exporter.get_finished_spans()[len(first) :]
    (old_root,) = [s for s in first if s.parent is None]
    (new_root,) = [s for s in second if s.parent is None]
    assert _trace(new_root) != _trace(old_root)
    assert {_trace(s) for s in second} == {_trace(new_root)}
    assert attributes(new_root)["gen_ai.conversation.id"] == session_id
    assert attributes(new_root)["anabranch.resumed"] is True
    assert "anabranch.resumed" not in attributes(old_root)
    linked = [
        (format_trace_id(k.context.trace_id), format_span_id(k.context.span_id))
        for k in new_root.links
    ]
    assert linked == [(_trace(old_root), _hex(old_root))]


ROOT = Path(__file__).resolve().parents[1]


def _load(reference: str) -> Agent:
    from anabranch.runtime._loader import load_object

    agent = load_object(f"{ROOT / 'examples' / reference}")
    assert isinstance(agent, Agent)
    return agent


async def _multi_agent_run(
    tmp_path: Path, provider: TracerProvider, reference: str, task: str, rounds: int = 1
) -> tuple[str, list[Any], list[dict[str, Any]], list[Any]]:
    """Run an example supervisor offline; returns session id, runs, call rows, boundaries."""
    model = TestModel(rounds=rounds)
    async with Runtime(db=tmp_path / "t.db", model=model, tracer_provider=provider) as rt:
        result = await rt.run(_load(reference), task)
        runs = await rt.store.list_runs(result.session_id)
        calls = await sql(
            rt.store,
            "SELECT c.id, c.run_id FROM calls c JOIN runs r ON r.id = c.run_id "
            "WHERE r.session_id = ?",
            (result.session_id,),
        )
        boundaries = await rt.store.list_boundaries(session_id=result.session_id)
    return result.session_id, runs, calls, boundaries


def _check_agent_tree(spans: tuple[ReadableSpan, ...], session_id: str, runs: list[Any]) -> None:
    """Root agent span, children under their parent's spawn_agent call, one trace."""
    by_id = {_hex(s): s for s in spans}
    agent_spans = {
        attributes(s)["gen_ai.agent.id"]: s for s in spans if s.name.startswith("invoke_agent ")
    }
    assert set(agent_spans) == {r.id for r in runs}  # one invoke_agent span per run
    for run in runs:
        span = agent_spans[run.id]
        assert span.name == f"invoke_agent {run.agent_name}"
        if run.parent_run_id is None:
            assert span.parent is None
            continue
        spawn_span = by_id[_parent(span) or ""]
        assert spawn_span.name == "execute_tool spawn_agent"
        assert attributes(spawn_span)["gen_ai.tool.call.id"] == run.parent_call_id
        assert _parent(spawn_span) == _hex(agent_spans[run.parent_run_id])
    assert {_trace(s) for s in spans} == {_trace(s) for s in spans if s.parent is None}
    assert len({_trace(s) for s in spans}) == 1  # one trace per session
    assert all(attributes(s)["gen_ai.conversation.id"] == session_id for s in spans)


async def test_multi_agent_span_tree(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    session_id, runs, calls, _ = await _multi_agent_run(
        tmp_path, provider, "research.py:supervisor", "Compare SQLite and DuckDB"
    )
    assert len(runs) == 3  # the supervisor and its two researchers
    spans = exporter.get_finished_spans()
    _check_agent_tree(spans, session_id, runs)
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert len(chats) == len(calls)  # exactly one inference span per model call
    by_id = {_hex(s): s for s in spans}
    agent_of = {r.id: r.agent_name for r in runs}
    for chat in chats:  # each under the agent run that made the call
        parent = by_id[_parent(chat) or ""]
        assert parent.name.startswith("invoke_agent ")
        run_id = attributes(parent)["gen_ai.agent.id"]
        assert attributes(chat)["gen_ai.agent.name"] == agent_of[str(run_id)]
    per_run = {r.id: sum(1 for c in calls if c["run_id"] == r.id) for r in runs}
    for run_id, count in per_run.items():
        assert count == sum(
            1
            for c in chats
            if (by_id[_parent(c) or ""].attributes or {})["gen_ai.agent.id"] == run_id
        )


async def test_compaction_spans_in_a_multi_agent_run(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    session_id, runs, calls, boundaries = await _multi_agent_run(
        tmp_path, provider, "long_task.py:supervisor", "Write the survey history", rounds=8
    )
    spans = exporter.get_finished_spans()
    _check_agent_tree(spans, session_id, runs)
    by_id = {_hex(s): s for s in spans}
    agent_spans = {
        attributes(s)["gen_ai.agent.id"]: s for s in spans if s.name.startswith("invoke_")
    }
    compacts = [s for s in spans if s.name.startswith("compact ")]
    agent_of = {r.id: r.agent_name for r in runs}
    compacted_runs = {b.run_id for b in boundaries}
    assert {agent_of[r] for r in compacted_runs} == {"supervisor", "archivist", "analyst"}

    # one compact span per compaction, under the agent that compacted, matching the store
    def summary(run_id: str, a: Any) -> tuple[Any, ...]:
        return (
            run_id,
            a["anabranch.compaction.strategy"],
            a["anabranch.compaction.trigger"],
            a["anabranch.compaction.tokens_before"],
            a["anabranch.compaction.tokens_after"],
            a["anabranch.compaction.messages_before"],
            a["anabranch.compaction.messages_after"],
        )

    from_spans = []
    for span in compacts:
        a = attributes(span)
        run_id = str(a["gen_ai.agent.id"])
        assert _parent(span) == _hex(agent_spans[run_id])
        assert span.name == f"compact {agent_of[run_id]}"
        assert a["openinference.span.kind"] == "CHAIN"
        assert a["gen_ai.operation.name"] == "compact"
        assert a["anabranch.compaction.tokens_after"] < a["anabranch.compaction.tokens_before"]
        assert a["anabranch.compaction.kept"] >= 0 and "anabranch.compaction.failure" not in a
        assert (
            json.loads(str(a["input.value"]))["tokens"] == a["anabranch.compaction.tokens_before"]
        )
        assert (
            json.loads(str(a["output.value"]))["tokens"] == a["anabranch.compaction.tokens_after"]
        )
        assert a["output.mime_type"] == "application/json"
        from_spans.append(summary(run_id, a))
    from_store = [
        (
            b.run_id,
            b.strategy,
            b.trigger,
            b.tokens_before,
            b.tokens_after,
            b.messages_before,
            b.messages_after,
        )
        for b in boundaries
    ]
    assert sorted(from_spans) == sorted(from_store)

    # the summarizer's model call nests under its compact span; no other call does
    chats = [s for s in spans if s.name.startswith("chat ")]
    summarizer = [s for s in chats if by_id[_parent(s) or ""].name.startswith("compact ")]
    summarized = [
        s for s in compacts if attributes(s)["anabranch.compaction.strategy"] == "summarize"
    ]
    assert len(summarizer) >= len(summarized) > 0
    assert all(attributes(s)["anabranch.call.purpose"] == "compaction" for s in summarizer)
    assert {_parent(s) for s in summarizer} == {_hex(s) for s in summarized}
    assert len(chats) - len(summarizer) == len(calls)  # one span per agent model call

    # content is off by default: no prompt, tool output or summary text in any span
    text = _all_text(spans)
    assert "Chapter " not in text and "Ledger entries" not in text and "<summary>" not in text
    for span in spans:
        keys = set(attributes(span))
        assert not keys & {"gen_ai.input.messages", "gen_ai.output.messages"}, span.name
        if not span.name.startswith("compact "):
            assert not keys & {"input.value", "output.value"}, span.name

    # inference spans after a run's first compaction say the context is compacted
    for run_id in compacted_runs:
        own = sorted(
            (s for s in chats if _parent(s) == _hex(agent_spans[run_id])),
            key=lambda s: s.start_time or 0,
        )
        first = min(
            (s.start_time or 0) for s in compacts if attributes(s)["gen_ai.agent.id"] == run_id
        )
        for chat in own:
            flagged = attributes(chat).get("gen_ai.conversation.compacted") is True
            assert flagged == ((chat.start_time or 0) > first), chat.name


async def test_resumed_graph_session_links_to_the_earlier_trace(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    import anyio

    from anabranch import Graph, Task

    blocked = anyio.Event()
    allow = False

    @tool(timeout=30)
    async def step() -> str:
        """Block until allowed."""
        if not allow:
            blocked.set()
            await anyio.sleep_forever()
        return "stepped"

    graph = Graph(
        name="paused",
        tasks=[
            Task(id="first", agent=worker, prompt="Go."),
            Task(
                id="second",
                agent=worker.model_copy(update={"name": "stepper", "tools": (step,)}),
                prompt="Step.",
                depends_on=["first"],
            ),
        ],
    )
    db = tmp_path / "g.db"
    sessions: list[str] = []
    async with Runtime(db=db, model=TestModel(), tracer_provider=provider) as rt:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:

                async def drive() -> None:
                    await rt.run_graph(graph, on_session=sessions.append)

                group.start_soon(drive)
                await blocked.wait()
                group.cancel_scope.cancel()
    first = exporter.get_finished_spans()
    allow = True
    async with Runtime(db=db, model=TestModel(), tracer_provider=provider, graphs=[graph]) as rt:
        result = await rt.resume(sessions[0])
    assert result.status == "done"
    second = exporter.get_finished_spans()[len(first) :]
    (old_root,) = [s for s in first if s.parent is None]
    (new_root,) = [s for s in second if s.parent is None]
    assert old_root.name == new_root.name == "invoke_workflow paused"
    assert {_trace(s) for s in second} == {_trace(new_root)} != {_trace(old_root)}
    assert attributes(new_root)["gen_ai.conversation.id"] == sessions[0]
    assert [
        (format_trace_id(k.context.trace_id), format_span_id(k.context.span_id))
        for k in new_root.links
    ] == [(_trace(old_root), _hex(old_root))]
    # the interrupted task's run links to its own earlier span too; the finished one is not re-run
    (stepper,) = [s for s in second if s.name == "invoke_agent stepper"]
    (old_stepper,) = [s for s in first if s.name == "invoke_agent stepper"]
    assert [format_span_id(k.context.span_id) for k in stepper.links] == [_hex(old_stepper)]
    assert not [s for s in second if s.name == "invoke_agent worker"]


SDK_SCRIPT = """
import sys, anyio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from anabranch import Agent, AnthropicModel, Runtime, tool
from anabranch.testing import MessagesServer, TestModel

@tool
def lookup(topic: str) -> str:
    '''Look a topic up.'''
    return "notes on " + topic

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)  # a global provider: the SDK would trace into it

async def main():
    agent = Agent(name="w", model="claude-opus-4-8", instructions="Work.", tools=[lookup])
    async with MessagesServer(policy=TestModel()) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        async with Runtime(db=sys.argv[1], model=model) as rt:
            await rt.run(agent, "task")
        await model.aclose()
        print(len(srv.log))

anyio.run(main)
for span in exporter.get_finished_spans():
    print(span.name)
"""


def test_one_inference_span_per_call_even_with_a_global_provider(tmp_path: Path) -> None:
    """The SDK's own ``anthropic.messages.create`` spans stay off: never two per call."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OTEL_"))}
    env["PYTHONPATH"] = str(ROOT / "src")
    done = subprocess.run(
        [sys.executable, "-c", SDK_SCRIPT, str(tmp_path / "t.db")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    requests, *names = done.stdout.split("\n")
    names = [n for n in names if n]
    assert int(requests) == 2  # a tool turn, then the answer
    assert names.count("chat claude-opus-4-8") == 2
    assert not [n for n in names if n.startswith("anthropic.")]
    assert names.count("invoke_agent w") == 1
