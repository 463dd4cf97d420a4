"""Two results of a turn finishing together: the second waits for the first's lone commit
and closes the turn (its result, the results message and the next call's row in one
transaction) instead of being committed alone too; if the first's commit fails, the
second is still committed alone, and no results message refers to the missing one."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from anabranch import Agent, Runtime, tool
from anabranch.errors import StoreError
from anabranch.messages import ModelRequest, TextBlock, ToolUseBlock
from anabranch.store import CallRecord, MessageRecord, SpillRecord, SQLiteStore, ToolEventRecord
from anabranch.testing import FunctionModel

from .helpers import sql, traced_store

pytestmark = pytest.mark.anyio


@tool
def left() -> str:
    """Left."""
    return "left result"


@tool
def right() -> str:
    """Right."""
    return "right result"


def _model() -> FunctionModel:
    def answer(request: ModelRequest) -> list[TextBlock | ToolUseBlock] | str:
        results = [b for m in request.messages for b in m.tool_results]
        if results:
            return "done: " + " | ".join(r.content for r in results)
        return [ToolUseBlock(id=f"toolu_{n}", name=n, input={}) for n in ("left", "right")]

    return FunctionModel(answer)


def _holding(transactions: list[list[str]], *parts: str) -> list[list[str]]:
    return [t for t in transactions if any(all(p in s for p in parts) for s in t)]


async def test_the_second_of_two_results_finishing_together_closes_the_turn(
    tmp_path: Path,
) -> None:
    agent = Agent(name="a", tools=[left, right])
    store, transactions = await traced_store(tmp_path / "db")
    with anyio.fail_after(20):
        async with Runtime(store=store, model=_model()) as rt:
            result = await rt.run(agent, "go")
    await store.close()
    assert result.output == "done: left result | right result"
    finished = _holding(transactions, "INSERT INTO tool_events", "'finished'")
    assert len(finished) == 2  # each result committed once, in its own transaction
    alone, closing = finished
    assert not [s for s in alone if "INSERT INTO messages" in s or "INSERT INTO calls" in s]
    assert [s for s in closing if "INSERT INTO messages" in s and "'user'" in s]
    assert [s for s in closing if "INSERT INTO calls" in s]  # and the next call's row
    users = _holding(transactions, "INSERT INTO messages", "'user'")
    assert len(users) == 2  # the task (with the run's start) and the results: nothing alone


async def _fail_lefts(event: ToolEventRecord | None) -> None:
    if event is not None and event.call_id == "toolu_left" and event.event == "finished":
        await anyio.lowlevel.checkpoint()
        raise StoreError("the disk is full")


class _FailsLeftsResult(SQLiteStore):
    """The real store, but ``left``'s result cannot be committed (whichever way)."""

    async def record_tool_event(
        self,
        event: ToolEventRecord,
        *,
        spills: Sequence[SpillRecord] = (),
        messages: Sequence[MessageRecord] = (),
    ) -> None:
        await _fail_lefts(event)
        await super().record_tool_event(event, spills=spills, messages=messages)

    async def begin_call(
        self,
        call: CallRecord,
        messages: Sequence[MessageRecord],
        *,
        tool_event: ToolEventRecord | None = None,
        spills: Sequence[SpillRecord] = (),
    ) -> int:
        await _fail_lefts(tool_event)
        return await super().begin_call(call, messages, tool_event=tool_event, spills=spills)


async def test_when_the_first_result_fails_to_commit_the_second_is_kept_alone(
    tmp_path: Path,
) -> None:
    agent = Agent(name="a", tools=[left, right])
    store = await _FailsLeftsResult.open(tmp_path / "db")
    with anyio.fail_after(20):
        async with Runtime(store=store, model=_model()) as rt:
            result = await rt.run(agent, "go")
            events = await sql(store, "SELECT call_id, event FROM tool_events ORDER BY id")
            users = await sql(store, "SELECT seq FROM messages WHERE role = 'user'")
    await store.close()
    assert result.status == "failed"
    # right ran and its result is committed (never run again); left's is not, and no
    # results message was committed without it
    assert ("toolu_right", "finished") in [(e["call_id"], e["event"]) for e in events]
    assert ("toolu_left", "finished") not in [(e["call_id"], e["event"]) for e in events]
    assert len(users) == 1  # the task only
