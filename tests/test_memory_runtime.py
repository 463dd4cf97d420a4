"""Long-term memory in runs, end to end through the real SDK against the local server:
remember/forget/log, the index in every prompt, relevant memories attached, sub-agents,
instruction files by level, selection by a model and its fallback, safety."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from anabranch import Agent, AnthropicModel, InstructionLevel, Memory, RetryPolicy, Runtime
from anabranch.memory import MemoryFolder
from anabranch.messages import Block, ModelRequest, TextBlock, ToolUseBlock
from anabranch.testing import FunctionModel, MessagesServer, TestModel

pytestmark = pytest.mark.anyio
_ids = itertools.count(1)
FAST = RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.02)


def _use(tool_name: str, /, **arguments: object) -> ToolUseBlock:
    return ToolUseBlock(id=f"toolu_mem{next(_ids):05d}", name=tool_name, input=dict(arguments))


def _answered(request: ModelRequest) -> bool:
    return any(m.tool_results for m in request.messages)


@asynccontextmanager
async def _runtime(
    respond: Callable[[ModelRequest], list[Block]],
    db: Path,
    provider: TracerProvider | None = None,
) -> AsyncIterator[tuple[Runtime, MessagesServer]]:
    async with MessagesServer(FunctionModel(respond)) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        try:
            async with Runtime(db=db, model=model, retry=FAST, tracer_provider=provider) as rt:
                yield rt, srv
        finally:
            await model.aclose()


def _requests(srv: MessagesServer) -> list[ModelRequest]:
    return [r.request for r in srv.log if r.status == 200 and r.request is not None]


REMEMBER = {
    "type": "user",
    "name": "prefers-metric",
    "description": "The user wants metric units in every estimate",
    "content": "Asked twice for kilometres instead of miles.",
}


def _remember_then_answer(request: ModelRequest) -> list[Block]:
    if any(t.name == "remember" for t in request.tools) and not _answered(request):
        return [_use("remember", **REMEMBER)]
    return [TextBlock(text="Noted.")]


def _plain(request: ModelRequest) -> list[Block]:
    return [TextBlock(text="An answer.")]


async def test_a_session_remembers_and_the_next_one_is_given_it(tmp_path: Path) -> None:
    memory = Memory(dir=tmp_path / "memory")
    agent = Agent(name="assistant", memory=memory, instructions="Help the user.")
    async with _runtime(_remember_then_answer, tmp_path / "a.db") as (rt, srv):
        first = await rt.run(agent, "I prefer kilometres, please remember that.")
        requests = _requests(srv)
    assert first.status == "done"
    # the memory file: typed, provenance-stamped; and its index line
    saved = MemoryFolder(tmp_path / "memory").read("prefers-metric")
    assert saved is not None and saved.type == "user"
    assert saved.source.session_id == first.session_id and saved.source.run_id == first.run_id
    assert saved.source.message_seq is not None
    index = (tmp_path / "memory" / "MEMORY.md").read_text()
    assert "- [prefers-metric](prefers-metric.md): The user wants metric units" in index
    # the snapshot stayed byte-stable inside the run although the index changed mid-run
    assert len(requests) == 2
    assert requests[0].system == requests[1].system
    assert "(no memories yet)" in requests[0].system[-1].text
    assert "remember" in requests[0].system[0].text  # guidance is static, cached

    async with _runtime(_plain, tmp_path / "a.db") as (rt, srv):
        second = await rt.run(agent, "Estimate the driving distance in metric units.")
        unrelated = await rt.run(agent, "Write a haiku about autumn leaves.")
        requests = _requests(srv)
    assert second.status == unrelated.status == "done"
    opening = requests[0]
    assert "[prefers-metric](prefers-metric.md)" in opening.system[-1].text
    user_turn = opening.messages[0]
    assert user_turn.content[0] == TextBlock(text="Estimate the driving distance in metric units.")
    attached = user_turn.content[-1]
    assert isinstance(attached, TextBlock) and "<relevant_memories>" in attached.text
    assert "Asked twice for kilometres" in attached.text
    # the attachment is part of the committed transcript (a resume resends it unchanged)
    stored = await _stored_first_message(tmp_path / "a.db", second.run_id)
    assert "<relevant_memories>" in stored
    haiku = requests[1].messages[0]
    assert all(
        "<relevant_memories>" not in b.text for b in haiku.content if isinstance(b, TextBlock)
    )


async def _stored_first_message(db: Path, run_id: str) -> str:
    async with Runtime(db=db, model=TestModel()) as rt:
        records = await rt.store.load_messages(run_id, from_seq=0, to_seq=0)
    return records[0].content


async def test_credentials_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    key = "sk-ant-api03-" + "Q" * 40

    def respond(request: ModelRequest) -> list[Block]:
        if not _answered(request):
            return [_use("remember", type="reference", name="api", description="key", content=key)]
        return [TextBlock(text="done")]

    agent = Agent(name="assistant", memory=Memory(dir=tmp_path / "memory"))
    async with _runtime(respond, tmp_path / "s.db") as (rt, srv):
        result = await rt.run(agent, "Remember my API key.")
        final = _requests(srv)[-1]
    assert result.status == "done"
    outcome = final.messages[-1].tool_results[0]
    assert outcome.is_error and "Anthropic API key" in outcome.content
    assert not (tmp_path / "memory" / "api.md").exists()
    assert key not in "".join(p.read_text() for p in (tmp_path / "memory").glob("*.md"))


async def test_a_write_past_the_index_cap_succeeds_but_asks_to_merge(tmp_path: Path) -> None:
    folder = MemoryFolder(tmp_path / "memory")
    for i in range(3):
        folder.write(name=f"m{i}", description=f"memory {i}", type="project", content="x")

    def respond(request: ModelRequest) -> list[Block]:
        if not _answered(request):
            return [_use("remember", type="project", name="m3", description="d", content="y")]
        return [TextBlock(text="done")]

    agent = Agent(name="a", memory=Memory(dir=tmp_path / "memory", index_max_lines=3))
    async with _runtime(respond, tmp_path / "c.db") as (rt, srv):
        await rt.run(agent, "Remember one more thing.")
        outcome = _requests(srv)[-1].messages[-1].tool_results[0]
    assert outcome.is_error and "Merge related memories" in outcome.content
    assert folder.read("m3") is not None
    assert "not shown" in _requests(srv)[0].system[-1].text


async def test_a_sub_agent_reads_its_parents_memory_read_only(tmp_path: Path) -> None:
    folder = MemoryFolder(tmp_path / "memory")
    folder.write(**REMEMBER)  # type: ignore[arg-type]
    helper = Agent(name="helper", description="Estimates distances.")
    supervisor = Agent(name="boss", memory=Memory(dir=tmp_path / "memory"), subagents=[helper])

    def respond(request: ModelRequest) -> list[Block]:
        tools = {t.name for t in request.tools}
        if "spawn_agent" in tools and not _answered(request):
            task = "Estimate the distance from Paris to Lyon in metric units."
            return [_use("spawn_agent", agent="helper", task=task)]
        return [TextBlock(text="about 465 km")]

    async with _runtime(respond, tmp_path / "sub.db") as (rt, srv):
        result = await rt.run(supervisor, "How far is Lyon from Paris?")
        requests = _requests(srv)
    assert result.status == "done"
    child = next(r for r in requests if "spawn_agent" not in {t.name for t in r.tools})
    assert {"remember", "forget"}.isdisjoint(t.name for t in child.tools)
    assert all("<memory_index" not in block.text for block in child.system)
    attached = child.messages[0].content[-1]
    assert isinstance(attached, TextBlock) and "Asked twice for kilometres" in attached.text
    boss = requests[0]
    assert {"remember", "forget"} <= {t.name for t in boss.tools}


async def test_a_cheap_model_picks_the_memories_and_a_failure_falls_back(tmp_path: Path) -> None:
    folder = MemoryFolder(tmp_path / "memory")
    folder.write(**REMEMBER)  # type: ignore[arg-type]
    folder.write(
        name="deploy-freeze",
        description="No deploys on Fridays",
        type="project",
        content="Agreed with the release team.",
    )
    answers = iter(['["deploy-freeze"]', "I cannot tell."])

    def respond(request: ModelRequest) -> list[Block]:
        if request.model == "claude-haiku-9":
            return [TextBlock(text=next(answers))]
        return [TextBlock(text="ok")]

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    memory = Memory(dir=tmp_path / "memory", select_model="claude-haiku-9")
    agent = Agent(name="assistant", memory=memory)
    async with _runtime(respond, tmp_path / "sel.db", provider) as (rt, srv):
        await rt.run(agent, "Plan Friday's release.")
        await rt.run(agent, "Give the distance in metric units.")
        requests = [r for r in _requests(srv) if r.model != "claude-haiku-9"]
    picked = requests[0].messages[0].content[-1]
    assert isinstance(picked, TextBlock) and 'name="deploy-freeze"' in picked.text
    assert "prefers-metric" not in picked.text
    fallback = requests[1].messages[0].content[-1]
    assert isinstance(fallback, TextBlock) and 'name="prefers-metric"' in fallback.text
    spans = [s for s in exporter.get_finished_spans() if s.name == "memory select assistant"]
    assert len(spans) == 2
    first, second = (dict(s.attributes or {}) for s in spans)
    assert first["anabranch.memory.method"] == "model"
    assert list(first["anabranch.memory.chosen"]) == ["deploy-freeze"]  # type: ignore[arg-type]
    assert first["anabranch.memory.considered"] == 2
    assert str(second["anabranch.memory.method"]).startswith("keywords (model")


async def test_instruction_files_from_every_level_in_order(tmp_path: Path) -> None:
    paths = {level: tmp_path / level / "AGENTS.md" for level in ("organization", "user", "local")}
    for level, path in paths.items():
        path.parent.mkdir()
        path.write_text(f"Rule from the {level} level.")
    levels = (
        InstructionLevel(level="organization", path=paths["organization"]),
        InstructionLevel(level="user", path=paths["user"]),
        InstructionLevel(level="project", path=tmp_path / "missing" / "AGENTS.md"),
        InstructionLevel(level="local", path=paths["local"]),
    )
    agent = Agent(name="a", instruction_files=levels)
    async with _runtime(_plain, tmp_path / "lv.db") as (rt, srv):
        await rt.run(agent, "hello")
        system = _requests(srv)[0].system[-1].text
    positions = [system.index(f'level="{level}"') for level in ("organization", "user", "local")]
    assert positions == sorted(positions)
    assert 'level="project"' not in system
    assert "later (more specific) one takes precedence" in system
    with pytest.raises(ValueError, match="ordered"):
        Agent(name="b", instruction_files=tuple(reversed(levels)))


async def test_offline_runs_exercise_memory_with_the_test_model(tmp_path: Path) -> None:
    memory = Memory(dir=tmp_path / "memory", log=True)
    agent = Agent(name="assistant", memory=memory)
    async with Runtime(db=tmp_path / "o.db", model=TestModel()) as rt:
        result = await rt.run(agent, "Remember that the user likes tea")
    assert result.status == "done"
    memories = MemoryFolder(tmp_path / "memory").all()
    assert len(memories) == 1 and memories[0].source.session_id == result.session_id
    logs = list((tmp_path / "memory" / "logs").glob("*/*/*.md"))
    assert len(logs) == 1 and "Remember that the user likes tea" in logs[0].read_text()


async def test_memory_tool_names_are_reserved_only_with_memory(tmp_path: Path) -> None:
    from anabranch import tool

    @tool
    def remember(text: str) -> str:
        """A user tool that happens to be called remember."""
        return text

    Agent(name="plain", tools=[remember])
    with pytest.raises(ValueError, match="reserved for memory tools"):
        Agent(name="mem", tools=[remember], memory=Memory(dir=tmp_path))
    assert json.dumps(Memory(dir=tmp_path).model_dump(mode="json"))
