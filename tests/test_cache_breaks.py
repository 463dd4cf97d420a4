"""Cache-break detection with synthetic usage: each cause, span events, resume, show."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from anabranch import Runtime
from anabranch.cli import main
from anabranch.errors import ModelConnectionError
from anabranch.messages import SystemBlock, ToolDefinition, Usage
from anabranch.models._retry import RetryPolicy
from anabranch.runtime._loop import AgentRun
from anabranch.testing import FunctionModel

from ._cache_support import Action, FakeClock, ScriptedPipeline, agent, compact, tool_loop
from .helpers import failed_with

pytestmark = pytest.mark.anyio

WARM = Usage(input_tokens=10, cache_creation_input_tokens=1000, output_tokens=5)
HIT = Usage(input_tokens=10, cache_read_input_tokens=1000, cache_creation_input_tokens=200)
SHORT = Usage(input_tokens=900, cache_read_input_tokens=300, cache_creation_input_tokens=50)
"""The third call reads 300 tokens although the second left 1200 in the cache."""
FULL = Usage(input_tokens=10, cache_read_input_tokens=5000)
"""Later calls (a compacted run makes more) read all there is."""


async def _breaks(rt: Runtime, session_id: str) -> list[dict[str, object]]:
    return await rt.store.list_cache_breaks(session_id)


async def _run(
    tmp_path: Path, actions: dict[int, Action], **kwargs: object
) -> list[dict[str, object]]:
    model = tool_loop(3, [WARM, HIT, SHORT, FULL, FULL, FULL])
    pipeline = ScriptedPipeline(actions)
    async with Runtime(db=tmp_path / "a.db", model=model, pipeline=pipeline, **kwargs) as rt:  # type: ignore[arg-type]
        result = await rt.run(agent(), "task")
        return await _breaks(rt, result.session_id)


async def _switch_model(run: AgentRun) -> None:
    run.agent = run.agent.model_copy(update={"model": "claude-haiku-5-5"})


async def _add_tool(run: AgentRun) -> None:
    extra = ToolDefinition(name="zz_extra", description="new", input_schema={"type": "object"})
    await run.save_snapshot(run.system, (*run.tools, extra), reason="test")


async def _edit_system(run: AgentRun) -> None:
    edited = (SystemBlock(text=run.system[0].text + " Also be brief."), *run.system[1:])
    await run.save_snapshot(edited, run.tools, reason="test")


async def _nothing(run: AgentRun) -> None:
    return None


@pytest.mark.parametrize(
    ("action", "cause"),
    [
        (_switch_model, "model_changed"),
        (_add_tool, "tools_changed"),
        (_edit_system, "system_changed"),
        (compact, "compaction"),
        (_nothing, "unknown"),
    ],
)
async def test_cache_break_cause(tmp_path: Path, action: Action, cause: str) -> None:
    breaks = await _run(tmp_path, {3: action})
    assert [(b["cause"], b["expected_read"], b["actual_read"]) for b in breaks] == [
        (cause, 1200, 300)
    ]


async def test_idle_beyond_the_ttl_is_ttl_expired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock(monkeypatch)

    async def idle(run: AgentRun) -> None:
        clock.advance(301)

    breaks = await _run(tmp_path, {3: idle})
    assert [b["cause"] for b in breaks] == ["ttl_expired"]


async def test_idle_within_a_1h_ttl_is_not_blamed_on_expiry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from anabranch import ContextPolicy

    clock = FakeClock(monkeypatch)

    async def idle(run: AgentRun) -> None:
        clock.advance(600)

    model = tool_loop(3, [WARM, HIT, SHORT, HIT])
    async with Runtime(
        db=tmp_path / "a.db", model=model, pipeline=ScriptedPipeline({3: idle})
    ) as rt:
        result = await rt.run(agent(context=ContextPolicy(cache_ttl="1h")), "task")
        breaks = await _breaks(rt, result.session_id)
    assert [b["cause"] for b in breaks] == ["unknown"]


async def test_full_reads_record_no_break(tmp_path: Path) -> None:
    model = tool_loop(3, [WARM, HIT, Usage(cache_read_input_tokens=1200), FULL])
    async with Runtime(db=tmp_path / "a.db", model=model) as rt:
        result = await rt.run(agent(), "task")
        assert await _breaks(rt, result.session_id) == []


async def test_break_is_a_span_event(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    await _run(tmp_path, {3: _edit_system}, tracer_provider=provider)
    chats = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    assert len(chats) == 4
    events = [
        (i, e) for i, s in enumerate(chats) for e in s.events if e.name == "anabranch.cache_break"
    ]
    assert len(events) == 1
    index, event = events[0]
    assert index == 2
    assert event.attributes is not None
    assert event.attributes["anabranch.cache.break.cause"] == "system_changed"
    assert event.attributes["anabranch.cache.break.expected_read_tokens"] == 1200
    assert event.attributes["anabranch.cache.break.actual_read_tokens"] == 300


async def test_break_after_resume_compares_with_the_call_before_the_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock(monkeypatch)
    scripted = tool_loop(3, [WARM, HIT])

    def fail_third(request: object) -> object:
        if len(crashing.requests) == 3:
            raise ModelConnectionError("network down")
        return scripted.function(request)  # type: ignore[arg-type]

    crashing = FunctionModel(fail_third)
    scripted.requests = crashing.requests
    db = tmp_path / "a.db"
    worker = agent()
    async with Runtime(db=db, model=crashing, retry=RetryPolicy(max_attempts=1)) as rt:
        failure = failed_with(await rt.run(worker, "task"), ModelConnectionError)
    session_id = failure.session_id
    assert session_id
    clock.advance(3600)
    resumed = tool_loop(3, [SHORT, HIT])
    async with Runtime(db=db, model=resumed, agents=[worker]) as rt:
        await rt.resume(session_id)
        breaks = await _breaks(rt, session_id)
    assert [(b["cause"], b["expected_read"]) for b in breaks] == [("ttl_expired", 1200)]


async def test_show_prints_cache_accounting_and_breaks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await _run(tmp_path, {3: _edit_system})
    db = str(tmp_path / "a.db")
    async with Runtime(db=db) as rt:
        session_id = (await rt.store.list_sessions())[0].id
    capsys.readouterr()
    assert await anyio.to_thread.run_sync(main, ["show", session_id, "--db", db]) == 0
    out = capsys.readouterr().out
    # 4 calls: uncached 10+10+900+10, read 0+1000+300+5000, write 1000+200+50+0
    assert "uncached 930, cache read 6300, cache write 1250" in out
    assert f"{6300 / (930 + 6300 + 1250):.1%} of input tokens read from cache" in out
    assert "cache breaks: system_changed x1" in out
    assert "cache break at call 3: system_changed (read 300 of 1200 tokens)" in out
    # claude-sonnet-5-5: $2 in, $10 out, 5m writes 1.25x, reads $0.10; 5 output tokens
    cost = (930 * 2 + 6300 * 0.1 + 1250 * 2.5 + 5 * 10) / 1e6
    assert f"estimated cost ${cost:.4f}" in out
    assert await anyio.to_thread.run_sync(main, ["show", session_id, "--calls", "--db", db]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if " call " in line]
    assert len(lines) == 4
    assert "CACHE BREAK: system_changed" in lines[2]
    assert "read 1000 (83%)" in lines[1]
    priced = '{"claude-sonnet-5-5": {"input": 0, "output": 0}}'
    assert (
        await anyio.to_thread.run_sync(main, ["show", session_id, "--prices", priced, "--db", db])
        == 0
    )
    assert "estimated cost $0.0000" in capsys.readouterr().out


async def test_unreadable_prices_are_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await _run(tmp_path, {})
    db = str(tmp_path / "a.db")
    async with Runtime(db=db) as rt:
        session_id = (await rt.store.list_sessions())[0].id
    capsys.readouterr()
    for prices in (str(tmp_path / "missing.json"), '{"m": {"input": "cheap"}}'):
        code = await anyio.to_thread.run_sync(
            main, ["show", session_id, "--prices", prices, "--db", db]
        )
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1
        assert len(err) == 1 and err[0].startswith("anabranch: error: cannot use prices from")
