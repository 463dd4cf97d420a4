"""A budget holds across a stop: what a session spent before it was stopped counts against
its budget (the session's, or an agent's own) when it is resumed, though a resumed session
reads that spend only when a budget needs it."""

from __future__ import annotations

from typing import Literal

import anyio
import pytest

from anabranch import Agent, Budget, Runtime, tool
from anabranch.messages import Block, ModelRequest, ToolUseBlock
from anabranch.testing import FunctionModel
from tests.databases import Db
from tests.test_resume import FAST

pytestmark = pytest.mark.anyio

BUDGET = 12_000


@tool
def lookup(topic: str) -> str:
    """Look one thing up."""
    return f"{topic}: " + "a fact worth keeping. " * 20


class Digger:
    """Looks one thing up per turn and never stops by itself; told to stop, it reports.
    At request ``block_on`` (counted across processes) it signals ``reached`` and hangs."""

    def __init__(self, block_on: int = 0) -> None:
        self.block_on = block_on
        self.reached = anyio.Event()
        self.requests = 0

    def model(self) -> FunctionModel:
        return FunctionModel(self.respond)

    async def respond(self, request: ModelRequest) -> list[Block] | str:
        self.requests += 1
        if self.requests == self.block_on:
            self.reached.set()
            await anyio.sleep_forever()
        if request.settings.tool_choice == "none":
            return "report of what was found"
        turn = sum(1 for m in request.messages if m.role == "assistant")
        return [ToolUseBlock(id=f"toolu_{turn}", name="lookup", input={"topic": f"t{turn}"})]


def _agent(scope: Literal["agent", "session"]) -> Agent:
    budget = Budget(max_tokens=BUDGET) if scope == "agent" else None
    return Agent(name="digger", tools=[lookup], max_turns=200, budget=budget)


def _session_budget(scope: Literal["agent", "session"]) -> Budget | None:
    return Budget(max_tokens=BUDGET) if scope == "session" else None


@pytest.mark.parametrize("scope", ["agent", "session"])
async def test_a_resumed_session_counts_what_it_spent_before_the_stop(
    db: Db, scope: Literal["agent", "session"]
) -> None:
    agent = _agent(scope)
    # the same session uninterrupted: how many requests the budget allows
    reference = Digger()
    async with Runtime(db=db, model=reference.model(), retry=FAST) as rt:
        whole = await rt.run(agent, "dig", budget=_session_budget(scope))
    assert whole.stop_reason == "budget" and whole.incomplete
    allowed = reference.requests
    assert allowed >= 6  # a stop mid-way leaves spend on both sides of it

    stopped_at = allowed // 2
    digger = Digger(block_on=stopped_at)
    session_id = await _stop(db, agent, digger, _session_budget(scope))
    with anyio.fail_after(60):
        async with Runtime(db=db, model=digger.model(), retry=FAST, agents=[agent]) as rt:
            resumed = await rt.resume(session_id, agent)
            spent = await rt.session_usage(session_id)
    assert resumed.stop_reason == "budget" and resumed.incomplete
    assert spent.total_input_tokens + spent.output_tokens <= BUDGET
    # the request in flight at the stop is sent again: one more than uninterrupted
    assert digger.requests == allowed + 1


async def _stop(db: Db, agent: Agent, digger: Digger, budget: Budget | None) -> str:
    """Run until the model is at request ``block_on``, then stop everything there."""
    ids: list[str] = []
    async with Runtime(db=db, model=digger.model(), retry=FAST) as rt:
        async with anyio.create_task_group() as group:

            async def run() -> None:
                await rt.run(agent, "dig", budget=budget, on_session=ids.append)

            group.start_soon(run)
            await digger.reached.wait()
            group.cancel_scope.cancel()
    assert ids, "the session was never created"
    return ids[0]
