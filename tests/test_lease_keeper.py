"""One renewal task per runtime keeps every lease it holds (``LeaseKeeper``).

Several sessions driven at once by one runtime, each longer than its lease's ttl, on both
backends: every lease is renewed while its session runs; a lease another process takes
stops its own session only; a renewal the store fails fails its own session with that
error; and the renewal task ends once no session is driven.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import anyio
import pytest

from anabranch import Agent, Runtime, ToolContext, tool
from anabranch.errors import LeaseLostError, StoreError
from anabranch.messages import Block, ModelRequest, ToolUseBlock
from anabranch.models._retry import RetryPolicy
from anabranch.runtime._lease_keeper import LeaseKeeper
from anabranch.testing import FunctionModel
from tests.databases import Db, rows
from tests.store_conformance.conftest import add_session

from .helpers import wait_until

pytestmark = pytest.mark.anyio

FAST = RetryPolicy(base_delay=0.0, max_delay=0.0)
TTL = 0.3
SESSIONS = 3


def _respond(request: ModelRequest) -> list[Block] | str:
    last = request.messages[-1]
    if not last.tool_results:
        return [ToolUseBlock(id="toolu_hold", name="hold", input={})]
    return "released"


class Gate:
    """A tool that holds each session until the test opens the gate."""

    def __init__(self) -> None:
        self.open = anyio.Event()
        self.entered: list[str] = []

    def tool(self) -> Any:
        gate = self

        @tool
        async def hold(ctx: ToolContext) -> str:
            """Wait until released."""
            gate.entered.append(ctx.session_id)
            await gate.open.wait()
            return "held"

        return hold


def _expires(db: Db) -> dict[str, float]:
    return {
        sid: float(expires) for sid, expires in rows(db, "SELECT session_id, expires FROM leases")
    }


async def test_every_lease_a_runtime_holds_is_renewed_while_its_session_runs(db: Db) -> None:
    gate = Gate()
    agent = Agent(name="worker", tools=[gate.tool()])
    results: list[str] = []
    with anyio.fail_after(60):
        async with Runtime(db=db, model=FunctionModel(_respond), retry=FAST, lease_ttl=TTL) as rt:
            async with anyio.create_task_group() as group:

                async def run(index: int) -> None:
                    result = await rt.run(agent, f"task {index}")
                    results.append(result.status)

                for index in range(SESSIONS):
                    group.start_soon(run, index)
                await wait_until(lambda: _entered(gate, SESSIONS))
                first = _expires(db)
                assert len(first) == SESSIONS

                async def renewed_twice() -> bool:
                    now = _expires(db)
                    return all(now[sid] >= first[sid] + 2 * TTL / 3 for sid in first)

                # each session outlives its lease's ttl several times over, and keeps it
                await wait_until(renewed_twice)
                gate.open.set()
            assert results == ["done"] * SESSIONS
            assert [await rt.store.lease_holder(sid) for sid in first] == [None] * SESSIONS


async def _entered(gate: Gate, count: int) -> bool:
    return len(gate.entered) == count


async def test_a_lease_taken_over_stops_its_own_session_only(db: Db) -> None:
    gate = Gate()
    agent = Agent(name="worker", tools=[gate.tool()])
    outcomes: dict[int, str] = {}
    ids: dict[int, str] = {}
    with anyio.fail_after(60):
        async with Runtime(db=db, model=FunctionModel(_respond), retry=FAST, lease_ttl=TTL) as rt:
            async with anyio.create_task_group() as group:
                for index in range(SESSIONS):
                    group.start_soon(_run_recorded, rt, agent, index, ids, outcomes)
                await wait_until(lambda: _entered(gate, SESSIONS))
                # another process took session 0 over after this one stalled
                rows(
                    db,
                    "UPDATE leases SET owner = 'thief', expires = 1e12 WHERE session_id = ?",
                    (ids[0],),
                )
                await wait_until(_has(outcomes, 0))
                gate.open.set()
    assert outcomes == {0: "lost", 1: "done", 2: "done"}
    assert rows(db, "SELECT owner FROM leases WHERE session_id = ?", (ids[0],)) == [("thief",)]
    # nothing written for the lost session after the loss
    statuses = rows(
        db, "SELECT status FROM session_events WHERE session_id = ? ORDER BY id", (ids[0],)
    )
    assert statuses and set(statuses) == {("running",)}


async def _run_recorded(
    rt: Runtime, agent: Agent, index: int, ids: dict[int, str], outcomes: dict[int, str]
) -> None:
    """Run session ``index``: record its id, then its status or what stopped it."""
    try:
        result = await rt.run(agent, f"task {index}", on_session=partial(ids.__setitem__, index))
        outcomes[index] = result.status
    except LeaseLostError:
        outcomes[index] = "lost"
    except StoreError as error:
        outcomes[index] = str(error)


def _has(outcomes: dict[int, str], index: int) -> Any:
    async def check() -> bool:
        return index in outcomes

    return check


async def test_a_renewal_the_store_fails_fails_its_own_session_with_the_error(db: Db) -> None:
    gate = Gate()
    agent = Agent(name="worker", tools=[gate.tool()])
    outcomes: dict[int, str] = {}
    ids: dict[int, str] = {}
    with anyio.fail_after(60):
        async with Runtime(db=db, model=FunctionModel(_respond), retry=FAST, lease_ttl=TTL) as rt:
            renew = rt.store.renew_lease

            async def failing(session_id: str, owner: str, ttl: float) -> bool:
                if session_id == ids.get(0):
                    raise StoreError("the database went away")
                return await renew(session_id, owner, ttl)

            rt.store.renew_lease = failing  # type: ignore[method-assign]
            async with anyio.create_task_group() as group:
                for index in range(SESSIONS):
                    group.start_soon(_run_recorded, rt, agent, index, ids, outcomes)
                await wait_until(lambda: _entered(gate, SESSIONS))
                await wait_until(_has(outcomes, 0))
                gate.open.set()
            assert outcomes == {0: "the database went away", 1: "done", 2: "done"}
            for index in range(SESSIONS):  # given back, the failed one's too
                assert await rt.store.lease_holder(ids[index]) is None


async def test_the_renewal_task_ends_once_no_lease_is_held(db: Db) -> None:
    async with Runtime(db=db) as rt:
        keeper = LeaseKeeper(rt.store, "me", TTL)
        for session_id in ("ses_a", "ses_b"):
            await add_session(rt.store, session_id)
            await rt.store.acquire_lease(session_id, "me", TTL)
        scope = anyio.CancelScope()  # what a lost lease would cancel
        held = [keeper.hold(session_id, scope) for session_id in ("ses_a", "ses_b")]
        first = _expires(db)
        await wait_until(lambda: _all_later(db, first))
        for lease in held:
            await keeper.drop(lease)
        with anyio.fail_after(5):
            await keeper.aclose()  # returns once the renewal task has ended
        assert not any(lease.lost or lease.error for lease in held)


async def _all_later(db: Db, first: dict[str, float]) -> bool:
    now = _expires(db)
    return all(now[sid] > first[sid] for sid in first)
