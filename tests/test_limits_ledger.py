"""The spend ledger of ``SessionLimits``, charged once per model call: a child's spend
counts toward every ancestor's budget (and the session's), and the stops and the
spend it reports are the same whatever other budgets the session has."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from anabranch import Agent, Budget
from anabranch.context._pricing import ModelPrice, PriceTable
from anabranch.messages import Message, ToolDefinition, Usage
from anabranch.runtime._run_limits import SessionLimits, Spend
from anabranch.store import RunRecord, SQLiteStore
from tests.store_conformance.conftest import add_run, add_session
from tests.store_conformance.test_usage_sums import finished_call

pytestmark = pytest.mark.anyio

PRICES = PriceTable({"m": ModelPrice(input=3, output=15)})
CALL = Usage(input_tokens=300, output_tokens=100, cache_read_input_tokens=50)
CALL_TOKENS = 450
CALL_USD = (300 * 3 + 50 * 0.3 + 100 * 15) / 1_000_000


@dataclass
class _Run:
    """What the ledger reads of a run (``LimitedRun``); env and events are never read
    while no soft limit warns."""

    record: RunRecord
    agent: Agent
    turns: int = 1
    turn_base: int = 0
    env: Any = None
    events: Any = None
    tools: tuple[ToolDefinition, ...] = ()
    context: list[Message] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.record.id


def _run(run_id: str, agent: Agent, parent: str | None = None) -> _Run:
    record = RunRecord(
        id=run_id,
        session_id="s",
        agent_name=agent.name,
        model=agent.model,
        created=0.0,
        parent_run_id=parent,
    )
    return _Run(record, agent)


def _tree(limits: SessionLimits, boss: Agent) -> tuple[_Run, _Run, _Run]:
    """boss -> middle -> leaf, attached as the loop attaches them."""
    runs = (
        _run("boss", boss),
        _run("middle", Agent(name="middle", model="m"), "boss"),
        _run("leaf", Agent(name="leaf", model="m"), "middle"),
    )
    for run in runs:
        limits.attach(run)
    return runs


@pytest.mark.parametrize("session_budget", [None, Budget(max_tokens=10**9)])
async def test_a_grandchilds_calls_count_toward_its_ancestors_budget(
    session_budget: Budget | None,
) -> None:
    limits = SessionLimits(session_id="s", budget=session_budget, prices=PRICES)
    boss, middle, leaf = _tree(
        limits, Agent(name="boss", model="m", budget=Budget(max_tokens=4 * CALL_TOKENS, soft=1.0))
    )
    assert limits.next_turn_now(leaf).stop is None
    await limits.charge(leaf, "m", CALL)
    await limits.charge(leaf, "m", CALL)
    assert limits.run_spend("boss") == Spend(2 * CALL_TOKENS, CALL_USD + CALL_USD)
    assert limits.run_spend("leaf") == limits.run_spend("boss")
    assert limits.run_spend("middle") == limits.run_spend("boss")
    assert limits.total == Spend(2 * CALL_TOKENS, CALL_USD + CALL_USD)
    # the leaf's next call and final report (its last call each) would pass the boss's
    # budget: the leaf stops; while it is driven, so does every run it spends under
    assert limits.next_turn_now(middle).stop is None  # the leaf is not driven: nothing next
    (await limits.enter(leaf)).driving = True  # as the loop drives it
    for run in (leaf, middle, boss):
        notes = limits.next_turn_now(run)
        assert notes.stop is not None and notes.stop.scope == "agent boss", run.id
    assert limits.next_turn_now(leaf).stop == limits.next_turn_now(boss).stop
    if session_budget is not None:
        assert limits.session is not None
        assert limits.session.spent == Spend(2 * CALL_TOKENS, CALL_USD + CALL_USD)


async def test_without_any_budget_nothing_stops_and_spend_is_still_counted() -> None:
    limits = SessionLimits(session_id="s", prices=PRICES)
    boss, _, leaf = _tree(limits, Agent(name="boss", model="m"))
    for _ in range(1000):
        await limits.charge(leaf, "m", CALL)
    await limits.charge(boss, "unpriced-model", CALL)
    assert limits.next_turn_now(leaf).stop is None
    assert limits.next_turn_now(leaf).blocks == ()
    assert limits.run_spend("leaf").tokens == 1000 * CALL_TOKENS
    assert limits.run_spend("boss").tokens == 1001 * CALL_TOKENS
    expected_usd = 0.0
    for _ in range(1000):
        expected_usd += CALL_USD  # summed call by call, as the ledger does
    assert limits.run_spend("boss").cost_usd == expected_usd


async def test_a_continued_sessions_earlier_spend_is_read_once_and_not_counted_twice(
    tmp_path: Path,
) -> None:
    """A session without a budget of its own reads what it spent before this process
    only when a run with a budget is entered; a call this process made and charged
    meanwhile is in the store by then, and must not count twice."""
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        await add_session(store, "s")
        await add_run(store, "boss", session_id="s")
        usage = CALL.model_dump()
        for turn in (1, 2):  # spent before this process
            await finished_call(store, "boss", turn, "ok", "m", usage)
        limits = SessionLimits(session_id="s", prices=PRICES)
        await limits.load(store, "s")
        boss = _run("boss", Agent(name="boss", model="m"))
        await limits.enter(boss)
        assert limits.total == Spend()  # no budget: nothing read yet

        await finished_call(store, "boss", 3, "ok", "m", usage)  # this process's call
        await limits.charge(boss, "m", CALL)
        child = _run(
            "child", Agent(name="child", model="m", budget=Budget(max_tokens=10**6)), "boss"
        )
        await limits.enter(child)

        assert limits.run_spend("boss") == Spend(3 * CALL_TOKENS, 3 * CALL_USD)
        assert limits.total == limits.run_spend("boss")
    finally:
        await store.close()
