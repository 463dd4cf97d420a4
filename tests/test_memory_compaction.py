"""Memory around a compaction: durable facts are extracted from the range before it is
summarized (typed, provenance-stamped, once even across a kill), and relevant memories are
chosen again after the compaction and attached after the summary, identically on resume."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from anabranch import (
    Agent,
    AnthropicModel,
    ContextPolicy,
    Memory,
    RetryPolicy,
    Runtime,
    ToolContext,
    tool,
)
from anabranch.memory import MemoryFolder
from anabranch.memory._extract import EXTRACT_TOOL
from anabranch.messages import ModelRequest, ModelResponse, TextBlock, canonical_json
from anabranch.testing import MessagesServer, TestModel
from anabranch.testing._models import is_summary_request

pytestmark = pytest.mark.anyio
FAST = RetryPolicy(max_attempts=2, base_delay=0.0, max_delay=0.0)
SKIP = ("recall", "forget", "remember")
"""The test model calls every tool: not ``remember`` here, so only extraction saves."""
TASK = "I prefer metric units in every answer. Read parts 1 to 4 of the document."


@tool
async def read(part: int, ctx: ToolContext) -> str:
    """Read one part of the document."""
    return f"part {part}: " + "lorem ipsum dolor " * 60


@tool
async def read_long(part: int, ctx: ToolContext) -> str:
    """Read one long part of the document."""
    return f"part {part}: " + "lorem ipsum dolor " * 250


def _agent(memory: Memory, window: int = 3_000) -> Agent:
    return Agent(
        name="reader",
        model="reader-model",
        instructions="Read the parts, then summarize.",
        tools=[read if window < 5_000 else read_long],
        context=ContextPolicy(window=window, compact_at=0.6, output_reserve=300, keep_recent=2),
        max_tokens=300,
        memory=memory,
    )


def _is_extraction(request: ModelRequest) -> bool:
    return request.settings.tool_choice == EXTRACT_TOOL


def _is_selection(request: ModelRequest) -> bool:
    return not request.tools and "memories are available" in request.messages[-1].text


def _spans(provider_exporter: InMemorySpanExporter, name: str) -> list[dict[str, Any]]:
    return [
        dict(s.attributes or {}) for s in provider_exporter.get_finished_spans() if s.name == name
    ]


def _tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def test_durable_facts_are_extracted_before_the_range_is_summarized(tmp_path: Path) -> None:
    memory = Memory(dir=tmp_path / "memory", extract_before_compaction=True)
    provider, exporter = _tracing()
    with anyio.fail_after(60):
        async with MessagesServer(TestModel(rounds=4, skip_tools=SKIP)) as srv:
            model = AnthropicModel(base_url=srv.base_url, api_key="test")
            try:
                async with Runtime(
                    db=tmp_path / "s.db", model=model, retry=FAST, tracer_provider=provider
                ) as rt:
                    result = await rt.run(_agent(memory), TASK)
            finally:
                await model.aclose()
    assert result.status == "done"
    requests = [r.request for r in srv.log if r.status == 200 and r.request is not None]
    kinds = [
        "extract" if _is_extraction(r) else "summary" if is_summary_request(r) else "turn"
        for r in requests
    ]
    assert "summary" in kinds, "the scenario must compact"
    # the extraction is one request, sent before the summary of the same range
    assert kinds.index("extract") < kinds.index("summary")
    extraction = requests[kinds.index("extract")]
    assert [t.name for t in extraction.tools] == [EXTRACT_TOOL]
    assert "Never save" in extraction.system[0].text  # the memory guidance
    # answered as the real API does (a tool_use of save_memories, parsed by the SDK):
    # the memory below could come from nothing else

    saved = MemoryFolder(tmp_path / "memory").all()
    assert [m.name for m in saved] == ["i-prefer-metric-units-in"]
    fact = saved[0]
    assert fact.type == "user" and "metric units" in fact.content
    assert fact.source.run_id == result.run_id
    assert fact.source.session_id == result.session_id
    assert fact.source.message_range is not None and fact.source.message_range[0] == 0
    text = (tmp_path / "memory" / f"{fact.name}.md").read_text()
    assert f"source_messages: {fact.source.range_text}" in text
    assert f"- [{fact.name}]({fact.name}.md)" in (tmp_path / "memory" / "MEMORY.md").read_text()

    spans = _spans(exporter, "memory extract reader")
    assert spans and list(spans[0]["anabranch.memory.saved"]) == [fact.name]
    # each later compaction reads only what was not extracted yet
    ranges = [s["anabranch.memory.range"] for s in spans if "anabranch.memory.range" in s]
    starts = [int(str(r).split("-")[0]) for r in ranges]
    ends = [int(str(r).split("-")[1]) for r in ranges]
    assert all(s > e for s, e in zip(starts[1:], ends, strict=False))


async def test_a_secret_in_an_extracted_fact_is_not_saved(tmp_path: Path) -> None:
    memory = Memory(dir=tmp_path / "memory", extract_before_compaction=True)
    task = "I always use the key sk-ant-api03-abcdefghijklmnopqrstuvwxyz. Read parts 1 to 4."
    with anyio.fail_after(60):
        async with Runtime(
            db=tmp_path / "s.db", model=TestModel(rounds=4, skip_tools=SKIP), retry=FAST
        ) as rt:
            result = await rt.run(_agent(memory), task)
    assert result.status == "done"
    assert MemoryFolder(tmp_path / "memory").all() == []
    assert "sk-ant" not in "".join(p.read_text() for p in (tmp_path / "memory").glob("*"))


class StopAt:
    """``TestModel``; with ``stop``, the first request matching it never returns."""

    def __init__(self, stop: Callable[[ModelRequest], bool] | None) -> None:
        self.inner = TestModel(rounds=4, skip_tools=SKIP)
        self.stop = stop
        self.reached = anyio.Event()
        self.requests: list[ModelRequest] = []

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        if self.stop is not None and self.stop(request):
            self.reached.set()
            await anyio.sleep_forever()
        return await self.inner.request(request)


async def _killed_at(
    db: Path, agent: Agent, stop: Callable[[ModelRequest], bool]
) -> tuple[str, StopAt]:
    model = StopAt(stop)
    ids: list[str] = []
    with anyio.fail_after(60):
        async with Runtime(db=db, model=model, retry=FAST) as rt:
            async with anyio.create_task_group() as group:

                async def run() -> None:
                    await rt.run(agent, TASK, on_session=ids.append)

                group.start_soon(run)
                await model.reached.wait()
                group.cancel_scope.cancel()
    return ids[0], model


def _boundaries(db: Path) -> list[Any]:
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute("SELECT kind, status, extra FROM boundaries ORDER BY id").fetchall()


async def test_a_kill_between_extraction_and_boundary_saves_nothing_twice(tmp_path: Path) -> None:
    memory = Memory(dir=tmp_path / "memory", extract_before_compaction=True)
    agent = _agent(memory)
    db = tmp_path / "s.db"
    session, first = await _killed_at(db, agent, is_summary_request)
    assert [_is_extraction(r) for r in first.requests].count(True) == 1
    assert _boundaries(db) == []  # the compaction was not committed
    folder = tmp_path / "memory"
    before = {p.name: p.read_text() for p in folder.glob("*.md")}
    assert "i-prefer-metric-units-in.md" in before

    provider, exporter = _tracing()
    resumed = StopAt(None)
    with anyio.fail_after(60):
        async with Runtime(
            db=db, model=resumed, retry=FAST, agents=[agent], tracer_provider=provider
        ) as rt:
            result = await rt.resume(session)
    assert result.status == "done"
    # the redone compaction asked nothing again and wrote nothing twice
    spans = _spans(exporter, "memory extract reader")
    assert spans[0]["anabranch.memory.skipped"] == "already extracted"
    extracted_again = [r for r in resumed.requests if _is_extraction(r)]
    assert all('<conversation messages="0-' not in r.messages[-1].text for r in extracted_again)
    after = {p.name: p.read_text() for p in folder.glob("*.md")}
    assert after["i-prefer-metric-units-in.md"] == before["i-prefer-metric-units-in.md"]
    assert [m.name for m in MemoryFolder(folder).all()] == ["i-prefer-metric-units-in"]


def _seed_memories(root: Path) -> None:
    folder = MemoryFolder(root)
    folder.write(
        name="read-parts-in-order",
        description="Read the document parts in order, the parts build on each other",
        type="feedback",
        content="The user asked to read document parts strictly in order.",
    )
    folder.write(
        name="document-parts-source",
        description="Where the document parts come from",
        type="reference",
        content="The document parts are exported from the wiki.",
    )
    folder.write(
        name="tea", description="The user likes green tea", type="user", content="Green tea."
    )


def _after_compaction(request: ModelRequest) -> bool:
    """A turn request whose context opens with a compaction summary."""
    if _is_extraction(request) or is_summary_request(request) or _is_selection(request):
        return False
    return "<summary_of_earlier_conversation>" in request.messages[0].text


async def test_memories_are_chosen_again_after_a_compaction(tmp_path: Path) -> None:
    _seed_memories(tmp_path / "memory")
    agent = _agent(Memory(dir=tmp_path / "memory", select=1), window=8_000)
    provider, exporter = _tracing()
    model = StopAt(None)
    with anyio.fail_after(60):
        async with Runtime(
            db=tmp_path / "s.db", model=model, retry=FAST, tracer_provider=provider
        ) as rt:
            result = await rt.run(agent, TASK)
    assert result.status == "done"
    first = model.requests[0]
    first_block = first.messages[0].content[-1]
    assert isinstance(first_block, TextBlock)
    assert 'name="read-parts-in-order"' in first_block.text
    later = next(r for r in model.requests if _after_compaction(r))
    opening = later.messages[0]
    attached = opening.content[-1]
    # after the summary, in the opening user turn; the one already surfaced is skipped
    assert isinstance(attached, TextBlock) and attached.text.startswith("<relevant_memories>")
    assert 'name="document-parts-source"' in attached.text
    assert 'name="read-parts-in-order"' not in attached.text
    assert opening.text.index("<summary_of_earlier_conversation>") < opening.text.index(
        "<relevant_memories>"
    )
    assert all("<relevant_memories>" not in b.text for b in later.system)
    selections = _spans(exporter, "memory select reader")
    assert selections[1]["anabranch.memory.after_compaction"] is True
    assert "read-parts-in-order" in list(selections[1]["anabranch.memory.skipped_surfaced"])
    extras = [json.loads(e) for k, _, e in _boundaries(tmp_path / "s.db") if k == "compaction"]
    assert {"read-parts-in-order", "document-parts-source"} <= set(extras[0]["memories_surfaced"])


async def test_a_resumed_run_sends_the_reselected_memories_byte_for_byte(tmp_path: Path) -> None:
    _seed_memories(tmp_path / "memory")
    agent = _agent(Memory(dir=tmp_path / "memory", select=1), window=8_000)
    db = tmp_path / "s.db"
    session, killed = await _killed_at(db, agent, _after_compaction)
    sent = killed.requests[-1]
    assert "<relevant_memories>" in sent.messages[0].text
    # a memory written since must not change what the resumed run sends
    MemoryFolder(tmp_path / "memory").write(
        name="parts-document-read",
        description="Read parts of the document, document parts, parts",
        type="project",
        content="Document parts.",
    )
    resumed = StopAt(None)
    with anyio.fail_after(60):
        async with Runtime(db=db, model=resumed, retry=FAST, agents=[agent]) as rt:
            result = await rt.resume(session)
    assert result.status == "done"
    again = resumed.requests[0]
    assert canonical_json(again.model_dump(mode="json")) == canonical_json(
        sent.model_dump(mode="json")
    )
