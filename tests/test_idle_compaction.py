"""Idle compaction: a conversation idle for most of its cache TTL is compacted while the
cache is warm, so the turn after the cache expired sends far fewer uncached tokens.

Through the real SDK against the local server, whose prompt cache runs on a manual clock;
the compactor's clock is the wall clock moved by the same offset. Nothing sleeps.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from anabranch import Agent, AnthropicModel, IdleCompactor, Runtime, UserError, tool
from anabranch.messages import ModelRequest, ToolUseBlock
from anabranch.testing import FunctionModel, ManualClock, MessagesServer
from anabranch.testing._models import is_summary_request

from .compaction_helpers import FAST_RETRY, small_policy

pytestmark = pytest.mark.anyio

HOUR = 3600.0


@tool
def survey(host: str) -> str:
    """Survey one host."""
    return f"{host}: fact F-{host.upper()} noted; " + "steady readings " * 60


def _agent(name: str, **policy: Any) -> Agent:
    settings: dict[str, Any] = {
        "window": 40_000,
        "tool_result_max_chars": 4_000,
        "cache_ttl": "1h",
        "idle_compact_min_tokens": 2_000,
    }
    settings.update(policy)
    return Agent(name=name, model="test-model", tools=[survey], context=small_policy(**settings))


def _policy() -> FunctionModel:
    def answer(request: ModelRequest) -> Any:
        if is_summary_request(request):
            return "<summary>Surveyed ten hosts; every fact is noted.</summary>"
        last = request.messages[-1]
        if last.role == "user" and not last.tool_results and len(request.messages) > 1:
            return "Here is the report."
        done = sum(1 for m in request.messages for _ in m.tool_results)
        if done >= 10:
            return "All hosts surveyed."
        host = f"{request.messages[0].text.split()[-1]}-{done}"
        return [ToolUseBlock(id=f"toolu_i{done}", name="survey", input={"host": host})]

    return FunctionModel(answer)


def _uncached(record: Any) -> int:
    usage = record.usage
    return int(usage.input_tokens + usage.cache_creation_input_tokens)


async def test_an_idle_conversation_is_compacted_before_its_cache_expires(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    offset = {"seconds": 0.0}
    with anyio.fail_after(60):
        async with MessagesServer(_policy(), clock=clock) as server:
            model = AnthropicModel(base_url=server.base_url, api_key="test")
            keen, off = _agent("keen"), _agent("plain", idle_compaction=False)
            try:
                async with Runtime(
                    db=tmp_path / "i.db", model=model, retry=FAST_RETRY, agents=[keen, off]
                ) as rt:
                    a = await rt.run(keen, "Survey the hosts of site alpha")
                    b = await rt.run(off, "Survey the hosts of site bravo")
                    assert a.status == b.status == "done", (a.error, b.error)
                    idle = IdleCompactor(rt, clock=lambda: time.time() + offset["seconds"])

                    offset["seconds"] = clock.now = 10 * 60.0  # not yet due
                    early = await idle.sweep()
                    assert early.compacted == [] and early.next_due is not None
                    assert early.next_due - time.time() == pytest.approx(0.9 * HOUR, abs=120)

                    offset["seconds"] = clock.now = 0.9 * HOUR + 5  # 54 minutes: due
                    served = len(server.log)
                    swept = await idle.sweep()
                    assert [c.session_id for c in swept.compacted] == [a.session_id]
                    assert swept.compacted[0].outcome.applied
                    summaries = server.log[served:]
                    assert len(summaries) == 1 and summaries[0].request is not None
                    assert is_summary_request(summaries[0].request)
                    assert summaries[0].usage is not None
                    assert summaries[0].usage.cache_read_input_tokens > 0  # cache still warm
                    again = await idle.sweep()  # compacted since its last call: not again
                    assert again.compacted == []

                    offset["seconds"] = clock.now = 1.0 * HOUR + 60  # the cache has expired
                    served = len(server.log)
                    next_a = await rt.send(a.session_id, "Write the report.")
                    after_a = server.log[served:]
                    served = len(server.log)
                    next_b = await rt.send(b.session_id, "Write the report.")
                    after_b = server.log[served:]
                    boundaries = await rt.store.list_boundaries(session_id=a.session_id)
            finally:
                await model.aclose()
    assert next_a.status == next_b.status == "done"
    assert [b.trigger for b in boundaries if b.kind == "compaction"] == ["idle"]
    assert len(after_a) == len(after_b) == 1  # no summary at the turn itself
    compacted, plain = _uncached(after_a[0]), _uncached(after_b[0])
    print(f"uncached tokens of the next request: {compacted} compacted, {plain} not")
    assert compacted * 3 < plain, (compacted, plain)


async def test_too_late_small_or_being_driven_is_left_alone(tmp_path: Path) -> None:
    offset = {"seconds": 0.0}
    with anyio.fail_after(60):
        async with MessagesServer(_policy()) as server:
            model = AnthropicModel(base_url=server.base_url, api_key="test")
            big, small = _agent("big"), _agent("small", idle_compact_min_tokens=100_000)
            try:
                async with Runtime(
                    db=tmp_path / "l.db", model=model, retry=FAST_RETRY, agents=[big, small]
                ) as rt:
                    a = await rt.run(big, "Survey the hosts of site alpha")
                    b = await rt.run(small, "Survey the hosts of site bravo")
                    idle = IdleCompactor(rt, clock=lambda: time.time() + offset["seconds"])
                    offset["seconds"] = 0.9 * HOUR + 5
                    async with rt._driver.lease(a.session_id):  # someone drives it
                        busy = await idle.sweep()
                    offset["seconds"] = HOUR + 5  # past the TTL: too late to help
                    late = await idle.sweep([a.session_id, b.session_id])
            finally:
                await model.aclose()
    assert busy.compacted == [] and late.compacted == []
    with pytest.raises(UserError, match="interval"):
        IdleCompactor(rt, interval=0)


async def test_watch_compacts_when_a_session_becomes_due(tmp_path: Path) -> None:
    offset = {"seconds": 0.0}
    compacted = anyio.Event()
    seen: list[str] = []
    with anyio.fail_after(60):
        async with MessagesServer(_policy()) as server:
            model = AnthropicModel(base_url=server.base_url, api_key="test")
            agent = _agent("watched", cache_ttl="5m")
            try:
                async with Runtime(
                    db=tmp_path / "w.db", model=model, retry=FAST_RETRY, agents=[agent]
                ) as rt:
                    done = await rt.run(agent, "Survey the hosts of site alpha")
                    idle = IdleCompactor(
                        rt, clock=lambda: time.time() + offset["seconds"], interval=0.01
                    )

                    def found(item: Any) -> None:
                        seen.append(item.session_id)
                        compacted.set()

                    async with anyio.create_task_group() as group:
                        group.start_soon(idle.watch, found)
                        offset["seconds"] = 0.9 * 300 + 1  # 4.5 of 5 minutes
                        await compacted.wait()
                        group.cancel_scope.cancel()
            finally:
                await model.aclose()
    assert seen == [done.session_id]
