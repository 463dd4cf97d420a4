"""End to end on the local Messages API server (A1 cache semantics) through the real SDK."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from anabranch import AnthropicModel, ContextPolicy, Runtime
from anabranch.context._cache import MAX_BREAKPOINTS
from anabranch.context._tokens import estimate_request
from anabranch.errors import ModelError
from anabranch.messages import Message, ModelRequest, ToolDefinition, Usage
from anabranch.models._retry import RetryPolicy
from anabranch.runtime._loop import AgentRun
from anabranch.testing import ManualClock, MessagesServer
from anabranch.testing._records import RequestRecord

from ._cache_support import Action, FakeClock, ScriptedPipeline, agent, compact, tool_loop
from .helpers import failed_with

pytestmark = pytest.mark.anyio

INSTRUCTIONS = "Investigate with probe, then report what you found. " * 12


@asynccontextmanager
async def served(
    tmp_path: Path, tool_turns: int = 4, **options: Any
) -> AsyncIterator[tuple[MessagesServer, Runtime]]:
    options.setdefault("min_cache_tokens", 50)
    pipeline = options.pop("pipeline", None)
    retry = options.pop("retry", None)
    async with MessagesServer(tool_loop(tool_turns), **options) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        async with Runtime(
            db=tmp_path / "a.db",
            model=model,
            pipeline=pipeline,
            retry=retry,
        ) as rt:
            yield srv, rt
        await model.aclose()


def _calls(srv: MessagesServer) -> list[RequestRecord]:
    return [r for r in srv.log if r.endpoint == "messages" and r.status == 200]


def _usage(record: RequestRecord) -> Usage:
    assert record.usage is not None
    return record.usage


async def test_a_healthy_run_reads_what_the_previous_call_left(tmp_path: Path) -> None:
    async with served(tmp_path) as (srv, rt):
        result = await rt.run(agent(instructions=INSTRUCTIONS), "task")
        breaks = await rt.store.list_cache_breaks(result.session_id)
    calls = _calls(srv)
    assert len(calls) == 5
    assert breaks == []
    for before, after in zip(calls, calls[1:], strict=False):
        left = _usage(before).cache_read_input_tokens + _usage(before).cache_creation_input_tokens
        assert _usage(after).cache_read_input_tokens >= left > 0
    for record in calls:
        assert record.request is not None
        assert record.request.breakpoint_count() <= MAX_BREAKPOINTS
    assert result.usage.cache_read_input_tokens / result.usage.total_input_tokens > 0.6


async def test_resume_after_bootstrap_change_reads_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "AGENTS.md").write_text("Project rules: be careful. " * 10)
    moment = [dt.datetime(2026, 11, 30, 9, 0, tzinfo=dt.UTC)]
    monkeypatch.setattr("anabranch.runtime._bootstrap.now", lambda: moment[0])
    worker = agent(instructions=INSTRUCTIONS, workspace=workspace, include_date=True)
    db = tmp_path / "a.db"
    async with MessagesServer(tool_loop(4), min_cache_tokens=50) as srv:

        async def crash_after_changes(run: AgentRun) -> None:
            (workspace / "AGENTS.md").write_text("Completely different rules now.")
            moment[0] = dt.datetime(2027, 2, 1, tzinfo=dt.UTC)
            srv.inject("server_error")

        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        async with Runtime(
            db=db,
            model=model,
            pipeline=ScriptedPipeline({3: crash_after_changes}),
            retry=RetryPolicy(max_attempts=1),
        ) as rt:
            failure = failed_with(await rt.run(worker, "task"), ModelError)
        session_id = failure.session_id
        assert session_id
        async with Runtime(db=db, model=model, agents=[worker]) as rt:
            result = await rt.resume(session_id)
            breaks = await rt.store.list_cache_breaks(session_id)
        await model.aclose()
    calls = _calls(srv)
    assert result.status == "done"
    assert breaks == []
    systems = {tuple(b.text for b in r.request.system) for r in calls if r.request}
    assert len(systems) == 1
    assert "Project rules" in "".join(next(iter(systems)))
    resumed_first = calls[2]
    before = _usage(calls[1])
    left = before.cache_read_input_tokens + before.cache_creation_input_tokens
    assert _usage(resumed_first).cache_read_input_tokens >= left


async def _break_causes(tmp_path: Path, action: Action, **options: Any) -> list[str]:
    async with served(tmp_path, pipeline=ScriptedPipeline({3: action}), **options) as (_, rt):
        result = await rt.run(agent(instructions=INSTRUCTIONS), "task")
        return [str(b["cause"]) for b in await rt.store.list_cache_breaks(result.session_id)]


async def _switch_model(run: AgentRun) -> None:
    run.agent = run.agent.model_copy(update={"model": "claude-haiku-5-5"})


async def _add_tool(run: AgentRun) -> None:
    extra = ToolDefinition(name="zz_extra", description="new", input_schema={"type": "object"})
    await run.save_snapshot(run.system, (*run.tools, extra), reason="test")


@pytest.mark.parametrize(
    ("action", "cause"),
    [(_switch_model, "model_changed"), (_add_tool, "tools_changed"), (compact, "compaction")],
)
async def test_cause_on_the_server(tmp_path: Path, action: Action, cause: str) -> None:
    assert await _break_causes(tmp_path, action) == [cause]


async def test_system_change_on_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    moment = [dt.datetime(2026, 11, 30, 9, 0, tzinfo=dt.UTC)]
    monkeypatch.setattr("anabranch.runtime._bootstrap.now", lambda: moment[0])

    async def tick(run: AgentRun) -> None:
        moment[0] += dt.timedelta(seconds=5)

    worker = agent(
        instructions=INSTRUCTIONS,
        include_date=True,
        date_format="%H:%M:%S",
        context=ContextPolicy(system_prompt_snapshot=False),
    )
    async with served(tmp_path, pipeline=ScriptedPipeline({3: tick})) as (_, rt):
        result = await rt.run(worker, "task")
        breaks = await rt.store.list_cache_breaks(result.session_id)
    assert [b["cause"] for b in breaks] == ["system_changed"]


async def test_ttl_expiry_on_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loop_clock = FakeClock(monkeypatch)
    server_clock = ManualClock()

    async def idle(run: AgentRun) -> None:
        loop_clock.advance(301)
        server_clock.advance(301)

    causes = await _break_causes(tmp_path, idle, clock=server_clock)
    assert causes == ["ttl_expired"]


async def test_eviction_without_a_visible_cause_is_unknown(tmp_path: Path) -> None:
    async with served(tmp_path) as (srv, rt):

        async def evict(run: AgentRun) -> None:
            srv.cache.clear()

        rt.pipeline = ScriptedPipeline({3: evict})
        result = await rt.run(agent(instructions=INSTRUCTIONS), "task")
        breaks = await rt.store.list_cache_breaks(result.session_id)
    assert [b["cause"] for b in breaks] == ["unknown"]


async def test_forked_subagent_reads_the_parents_cached_prefix(tmp_path: Path) -> None:
    worker = agent(instructions=INSTRUCTIONS)
    async with served(tmp_path) as (srv, rt):
        result = await rt.run(worker, "task")
        env = rt.environment(result.session_id)
        parent = await AgentRun.load(env, worker, (await rt.store.list_runs(result.session_id))[0])
        parent_last = _usage(_calls(srv)[-1])
        fork = await AgentRun.start(
            env,
            worker,
            [*parent.context, Message.user("Now check the edge cases.")],
            parent_run_id=parent.id,
            depth=1,
            mode="fork",
            snapshot=(parent.system, parent.tools),
        )
        await fork.drive()
    fork_first = _usage(_calls(srv)[5])
    assert fork_first.cache_read_input_tokens >= (
        parent_last.cache_read_input_tokens + parent_last.cache_creation_input_tokens
    )


async def test_fresh_siblings_share_the_static_prefix(tmp_path: Path) -> None:
    child = agent(name="researcher", instructions=INSTRUCTIONS)
    async with served(tmp_path, tool_turns=0) as (srv, rt):
        result = await rt.run(agent(name="lead", instructions="Delegate."), "task")
        env = rt.environment(result.session_id)
        for i in range(2):
            sibling = await AgentRun.start(
                env, child, f"sub-task {i}", parent_run_id=result.run_id, depth=1, mode="fresh"
            )
            await sibling.drive()
    first, second = (_usage(r) for r in _calls(srv)[1:])
    assert first.cache_creation_input_tokens > 0
    static = estimate_request(
        ModelRequest(
            model="m",
            tools=_calls(srv)[1].request.tools,  # type: ignore[union-attr]
            system=_calls(srv)[1].request.system,  # type: ignore[union-attr]
            messages=(),
        )
    )
    assert second.cache_read_input_tokens >= static > 0
