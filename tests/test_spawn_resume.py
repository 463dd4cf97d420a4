"""Cancelling a session mid-children leaves a consistent store; resume finishes the tree
without restarting children or redoing finished ones."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from anabranch import Agent, ContextPolicy, Runtime, ToolContext, tool
from anabranch.messages import ModelRequest
from anabranch.runtime._children import open_run
from anabranch.runtime._loop import AgentRun
from anabranch.runtime._spawn import SpawnTool
from anabranch.store import RunRecord, SessionRecord

from .subagent_helpers import (
    assert_store_consistent,
    eventually,
    first_turn,
    requests_for,
    results_of,
    routed,
    run_messages,
    runs_by_agent,
    spawn,
    use,
)

pytestmark = pytest.mark.anyio


class Scenario:
    """boss spawns a (whose tool blocks until allowed) and b (answers at once)."""

    def __init__(self) -> None:
        self.blocked = anyio.Event()
        self.allow = False
        self.call_ids: list[str] = []

        @tool(timeout=30)
        async def slow_step(ctx: ToolContext) -> str:
            """A step that may block."""
            self.call_ids.append(ctx.call_id)
            if not self.allow:
                self.blocked.set()
                await anyio.sleep_forever()
            return "slow step finished"

        self.a = Agent(name="a", model="a", tools=[slow_step])
        self.b = Agent(name="b", model="b")
        self.boss = Agent(
            name="boss",
            model="boss",
            subagents=[self.a, self.b],
            context=ContextPolicy(window=8_000, output_reserve=500),
        )
        self.model = routed(boss=self._boss, a=self._a, b=lambda r: "b report")

    @staticmethod
    def _boss(request: ModelRequest) -> object:
        if first_turn(request):
            return [spawn("a", "do a"), spawn("b", "do b")]
        return "final: " + " | ".join(r.content for r in results_of(request))

    @staticmethod
    def _a(request: ModelRequest) -> object:
        return [use("slow_step", "toolu_slow")] if first_turn(request) else "a report"


async def _run_until_blocked(rt: Runtime, scenario: Scenario) -> str:
    session: list[str] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:

            async def drive() -> None:
                await rt.run(scenario.boss, "split it", on_session=session.append)

            group.start_soon(drive)
            await scenario.blocked.wait()

            async def b_done() -> bool:
                runs = await runs_by_agent(rt.store, session[0])
                return "b" in runs and runs["b"][0].status == "done"

            await eventually(b_done)
            group.cancel_scope.cancel()
    return session[0]


async def test_cancel_mid_children_then_resume(tmp_path: Path) -> None:
    scenario = Scenario()
    db = tmp_path / "cancel.db"
    async with Runtime(db=db, model=scenario.model) as rt:
        session_id = await _run_until_blocked(rt, scenario)
        session = await rt.store.get_session(session_id)
        before = await runs_by_agent(rt.store, session_id)
        await assert_store_consistent(rt.store, session_id)
    assert session is not None and session.status == "cancelled"
    assert before["a"][0].status == "running" and before["b"][0].status == "done"
    assert before["boss"][0].status == "running"

    scenario.allow = True
    async with Runtime(db=db, model=scenario.model, agents=[scenario.boss]) as rt:
        result = await rt.resume(session_id)
        after = await runs_by_agent(rt.store, session_id)
        await assert_store_consistent(rt.store, session_id)
        a_messages = await run_messages(rt.store, after["a"][0].id)
    assert result.status == "done"
    assert "a report" in result.output and "b report" in result.output
    assert {k: [r.id for r in v] for k, v in after.items()} == {
        k: [r.id for r in v] for k, v in before.items()
    }, "the same runs continue; no child is started twice"
    assert all(r.status == "done" for v in after.values() for r in v)
    assert len(requests_for(scenario.model, "b")) == 1, "the finished child is not redone"
    assert scenario.call_ids == ["toolu_slow", "toolu_slow"], "same call id on the re-run"
    assert [m.text for m in a_messages if m.role == "user" and m.text] == ["do a"]


async def test_spawning_again_for_the_same_call_returns_the_stored_report(
    tmp_path: Path,
) -> None:
    scenario = Scenario()
    scenario.allow = True
    async with Runtime(db=tmp_path / "idem.db", model=scenario.model) as rt:
        result = await rt.run(scenario.boss, "split it")
        runs = await runs_by_agent(rt.store, result.session_id)
        env = rt.environment(result.session_id)
        root = await AgentRun.load(env, scenario.boss, runs["boss"][0])
        turn = next(i for i, m in enumerate(root.context) if m.tool_uses)
        root.context = root.context[: turn + 1]  # as when the spawn calls ran
        calls = root.context[turn].tool_uses
        again = [await SpawnTool().run(root, call) for call in calls]
        runs_after = await rt.store.list_runs(result.session_id)
    first = results_of(requests_for(scenario.model, "boss")[-1])
    assert [o.content for o in again] == [r.content for r in first]
    assert len(runs_after) == 3
    assert len(requests_for(scenario.model, "a")) == 2  # not driven again


async def test_a_child_interrupted_before_its_first_message_is_completed(
    tmp_path: Path,
) -> None:
    scenario = Scenario()
    async with Runtime(db=tmp_path / "half.db", model=scenario.model) as rt:
        await rt.store.create_session(
            SessionRecord(id="ses_manual", created=time.time(), kind="agent", entry="b", task="b")
        )
        env = rt.environment("ses_manual")
        record = RunRecord(
            id="run_half", session_id="ses_manual", agent_name="b", model="b", created=time.time()
        )
        await rt.store.create_run(record)  # crashed right after this commit
        run = await open_run(env, scenario.b, await rt.store.get_run("run_half"), "do b")
        output = await run.drive()
        snapshot = await rt.store.latest_snapshot("run_half")
        messages = await run_messages(rt.store, "run_half")
    assert output == "b report"
    assert snapshot is not None
    assert [m.text for m in messages] == ["do b", "b report"]
