"""The rules for thinking, images and documents that compaction, caching and tracing keep."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from anabranch import Agent, ContextPolicy, Image, ModelSettings, Runtime, tool
from anabranch.context._budget import clear_tool_results
from anabranch.context._cache import CallCacheState, classify_cache_break
from anabranch.context._content import (
    attachments_handle,
    content_violations,
    drop_thinking,
)
from anabranch.messages import (
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from anabranch.messages import (
    ModelSettings as Settings,
)
from anabranch.testing import TestModel, thinking_block

pytestmark = pytest.mark.anyio

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
IMAGE = Image(data=PNG, media_type="image/png")


def _tool_loop(first: Any) -> list[Message]:
    use = ToolUseBlock(id="toolu_1", name="shot", input={})
    return [
        Message.user("look"),
        Message(role="assistant", content=(first, use) if first else (use,)),
        Message(
            role="user",
            content=(
                ToolResultBlock(tool_use_id="toolu_1", content="x" * 500, attachments=(IMAGE,)),
            ),
        ),
    ]


def test_clearing_takes_images_out_whole_with_a_recall_handle() -> None:
    messages = _tool_loop(thinking_block("plan"))
    cleared, spills = clear_tool_results(messages, keep_last=0, run_id="run_1")
    result = cleared[2].tool_results[0]
    assert result.attachments == ()
    assert "image image/png" in result.content and "recall id=" in result.content
    assert spills[0].attachments == (IMAGE,)
    assert cleared[1] is messages[1]  # the thinking turn is untouched


def test_compaction_checks_catch_edited_thinking_and_a_lost_lead() -> None:
    before = _tool_loop(thinking_block("plan"))
    edited = [
        before[0],
        Message(
            role="assistant",
            content=(ThinkingBlock(thinking="plan!", signature="s"), before[1].content[1]),
        ),
        before[2],
    ]
    assert content_violations(before, edited, thinking=True) == [
        "messages.1: a thinking block was changed or invented"
    ]
    stripped = [before[0], Message(role="assistant", content=(before[1].content[1],)), before[2]]
    assert content_violations(before, stripped, thinking=True) == [
        "the last tool-use turn no longer starts with its thinking block"
    ]
    assert content_violations(before, before[:1], thinking=True) == []  # dropped with a range
    only = [Message.user("q"), Message(role="assistant", content=(thinking_block("t"),))]
    assert drop_thinking(only)[1].content == (TextBlock(text="(thought only)"),)


def _state(settings: Settings, read: int) -> CallCacheState:
    return CallCacheState(
        model="m",
        system_digest="s",
        tools_digest="t",
        compactions=0,
        started=0.0,
        usage=Usage(cache_read_input_tokens=read, cache_creation_input_tokens=100),
        settings=settings.cache_key(),
    )


def test_a_change_of_thinking_settings_is_a_named_cache_break_cause() -> None:
    before = _state(Settings(thinking_budget=2048), 500)
    assert classify_cache_break(before, _state(Settings(), 0), ttl="5m") == "thinking_changed"
    assert (
        classify_cache_break(before, _state(Settings(thinking_budget=4096), 0), ttl="5m")
        == "thinking_changed"
    )
    assert (
        classify_cache_break(
            _state(Settings(), 500), _state(Settings(tool_choice="none"), 0), ttl="5m"
        )
        == "tool_choice_changed"
    )
    assert (
        classify_cache_break(before, _state(Settings(thinking_budget=2048), 600), ttl="5m") is None
    )


@tool
def shot(page: int) -> list[Any]:
    """Render a page."""
    return [f"page {page}", IMAGE]


async def test_cleared_images_are_recallable(tmp_path: Path) -> None:
    agent = Agent(
        name="viewer",
        tools=[shot],
        context=ContextPolicy(
            window=20_000, clear_tool_results_after=0, clear_at=0.05, output_reserve=1000
        ),
    )
    async with Runtime(db=tmp_path / "r.db", model=TestModel(rounds=2)) as rt:
        result = await rt.run(agent, "look")
        boundaries = await rt.store.list_boundaries(run_id=result.run_id)
        spills = await rt.store.query("SELECT handle FROM spills")  # type: ignore[attr-defined]
        handles = [row["handle"] for row in spills]
        assert any(b.kind == "clear" for b in boundaries)
        plain = next(h for h in handles if not h.endswith(".attachments"))
        assert attachments_handle(plain) in handles
        from anabranch.runtime._loop import AgentRun
        from anabranch.runtime._recall import RecallTool

        record = next(r for r in await rt.store.list_runs(result.session_id))
        run = await AgentRun.load(rt.environment(result.session_id), agent, record)
        outcome = await RecallTool()._fetch(run, plain, 0)
    assert outcome.attachments == (IMAGE,)


async def test_chat_spans_carry_thinking_tokens_and_thinking_text_only_when_captured(
    tmp_path: Path,
) -> None:
    agent = Agent(
        name="thinker", max_tokens=4096, model_settings=ModelSettings(thinking_budget=1024)
    )
    texts = {}
    for capture in (False, True):
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        async with Runtime(
            db=tmp_path / f"{capture}.db",
            model=TestModel(),
            tracer_provider=provider,
            capture_content=capture,
        ) as rt:
            await rt.run(agent, "ponder")
        chat = next(s for s in exporter.get_finished_spans() if s.name.startswith("chat"))
        attributes = dict(chat.attributes or {})
        assert int(attributes["gen_ai.usage.reasoning.output_tokens"]) > 0  # type: ignore[arg-type]
        texts[capture] = json.dumps(attributes, default=str)
    assert "Turn 1: the request is" not in texts[False]
    assert "Turn 1: the request is" in texts[True]


@tool
def read_notes(part: int) -> str:
    """Read a long part of the notes."""
    return f"part {part}: " + "the tide turns with the moon. " * 120


async def test_cache_diagnostics_name_the_break_instead_of_guessing(tmp_path: Path) -> None:
    from anabranch import AnthropicModel
    from anabranch.testing import MessagesServer

    def agent(diagnostics: bool) -> Agent:
        return Agent(
            name="notes",
            tools=[read_notes],
            max_tokens=2048,
            model_settings=ModelSettings(cache_diagnostics=diagnostics),
            context=ContextPolicy(window=9000, compact_at=0.5, output_reserve=2048, keep_recent=2),
        )

    causes = {}
    for diagnostics in (False, True):
        async with MessagesServer(TestModel(rounds=6), min_cache_tokens=0) as srv:
            model = AnthropicModel(base_url=srv.base_url, api_key="k")
            try:
                async with Runtime(db=tmp_path / f"{diagnostics}.db", model=model) as rt:
                    result = await rt.run(agent(diagnostics), "read the notes")
                    breaks = await rt.store.list_cache_breaks(result.session_id)
            finally:
                await model.aclose()
        assert result.status == "done"
        causes[diagnostics] = {b["cause"] for b in breaks}
    assert "compaction" in causes[False]  # inferred from the run's own records
    assert causes[True] == {"messages_changed"}  # as the API (here: the server) reports it
