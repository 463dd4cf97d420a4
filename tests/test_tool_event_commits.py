"""Tool calls across crashes: what is committed with the response, with each result, and
with the results message decides what a resumed run runs again."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import anyio
import pytest

from anabranch import Agent, Runtime, ToolContext, tool
from anabranch.events import Event, ToolCallFinished
from anabranch.messages import ModelRequest, TextBlock, ToolUseBlock
from anabranch.runtime._builtins import ToolOutcome
from anabranch.runtime._context_view import ContextView, Ingested
from anabranch.runtime._history import load_messages
from anabranch.runtime._loop import INTERRUPTED_REPORT
from anabranch.runtime._pipeline import PassThroughPipeline
from anabranch.store import (
    CallRecord,
    MessageRecord,
    SpillRecord,
    SQLiteStore,
    ToolEventRecord,
)
from anabranch.testing import FunctionModel

from .helpers import run_until, sql, traced_store, wait_until

pytestmark = pytest.mark.anyio


def _model(*names: str) -> FunctionModel:
    def answer(request: ModelRequest) -> list[TextBlock | ToolUseBlock] | str:
        results = [b for m in request.messages for b in m.tool_results]
        if results:
            return "done: " + " | ".join(r.content for r in results)
        return [ToolUseBlock(id=f"toolu_{n}", name=n, input={}) for n in names]

    return FunctionModel(answer)


async def _events(rt: Runtime) -> list[dict[str, object]]:
    return await sql(rt.store, "SELECT call_id, event, content FROM tool_events ORDER BY id")


async def test_started_with_the_response_finished_with_its_result(tmp_path: Path) -> None:
    @tool
    def fetch() -> str:
        """Fetch."""
        return "payload " * 50

    agent = Agent(name="a", tools=[fetch])
    async with Runtime(tmp_path / "db", model=_model("fetch")) as rt:
        result = await rt.run(agent, "go")
        events = await _events(rt)
        messages = await sql(rt.store, "SELECT content FROM messages WHERE role = 'user'")
        assert result.run_id is not None
        _, loaded = await load_messages(rt.store, result.run_id)
    assert result.output.startswith("done: payload")
    assert [(e["call_id"], e["event"]) for e in events] == [
        ("toolu_fetch", "started"),
        ("toolu_fetch", "finished"),
    ]
    # committed as it finished (so it is never run again); the results message refers to
    # that event instead of holding a second copy, and reads back with the whole result
    assert str(events[1]["content"]).startswith("payload payload")
    assert not any("payload payload" in str(m["content"]) for m in messages)
    assert any('"ref":"tool_event"' in str(m["content"]) for m in messages)
    results = [r for m in loaded for r in m.tool_results]
    assert [r.content for r in results] == ["payload " * 50]


@pytest.mark.parametrize("on_interrupt", ["retry", "report"])
async def test_a_tool_cut_off_mid_call_is_rerun_or_reported(
    tmp_path: Path, on_interrupt: Literal["retry", "report"]
) -> None:
    calls: list[str] = []
    inside = anyio.Event()

    @tool(on_interrupt=on_interrupt)
    async def pay() -> str:
        """Pay."""
        calls.append("pay")
        if len(calls) == 1:  # the process stops while the call is in flight
            inside.set()
            await anyio.sleep_forever()
        return "paid"

    agent = Agent(name="a", tools=[pay])
    db = tmp_path / "db"
    async with Runtime(db, model=_model("pay")) as rt:
        await run_until(rt, agent, "go", inside)
    async with Runtime(db, model=_model("pay")) as rt:
        session_id = (await rt.store.list_sessions())[0].id
        result = await rt.resume(session_id, agent)
    if on_interrupt == "retry":
        assert calls == ["pay", "pay"]
        assert result.output == "done: paid"
    else:
        assert calls == ["pay"]
        assert result.output == "done: " + INTERRUPTED_REPORT


async def test_a_finished_tool_is_not_run_again(tmp_path: Path) -> None:
    runs: dict[str, int] = {"fast": 0, "slow": 0}

    @tool
    async def fast() -> str:
        """Fast."""
        runs["fast"] += 1
        return "fast result"

    stopping = anyio.Event()

    @tool
    async def slow(ctx: ToolContext) -> str:
        """Slow."""
        runs["slow"] += 1
        if runs["slow"] == 1:
            async with Runtime(db) as reader:  # stop only once fast's result is committed

                async def fast_committed() -> bool:
                    events = await reader.store.tool_events(ctx.run_id, ["toolu_fast"])
                    return any(e.event == "finished" for e in events)

                await wait_until(fast_committed)
            stopping.set()  # the process stops while this call is in flight
            await anyio.sleep_forever()
        return "slow result"

    agent = Agent(name="a", tools=[fast, slow])
    db = tmp_path / "db"
    async with Runtime(db, model=_model("fast", "slow")) as rt:
        with anyio.fail_after(20):
            await run_until(rt, agent, "go", stopping)
    async with Runtime(db, model=_model("fast", "slow")) as rt:
        session_id = (await rt.store.list_sessions())[0].id
        result = await rt.resume(session_id, agent)
        events = await _events(rt)
    assert runs == {"fast": 1, "slow": 2}
    assert result.output == "done: fast result | slow result"
    finished = [e for e in events if e["event"] == "finished"]
    # fast finished first and was committed on its own, with its content
    assert finished[0]["call_id"] == "toolu_fast" and finished[0]["content"] == "fast result"


def _finishing(transactions: list[list[str]], call_id: str) -> list[str]:
    """The transaction that committed ``call_id``'s finished event."""
    (found,) = [
        t
        for t in transactions
        if any(
            "INSERT INTO tool_events" in s and f"'{call_id}'" in s and "'finished'" in s for s in t
        )
    ]
    return found


def _two_tools(effects: list[str]) -> tuple[Agent, anyio.Event, Callable[[Event], None]]:
    """``fast`` and ``slow`` in one turn; ``slow`` returns once ``fast`` is committed (its
    finished event is announced only then)."""
    fast_committed = anyio.Event()

    def on_event(event: Event) -> None:
        if isinstance(event, ToolCallFinished) and event.call_id == "toolu_fast":
            fast_committed.set()

    @tool
    async def fast(ctx: ToolContext) -> str:
        """Fast."""
        effects.append(f"fast {ctx.call_id}")
        return "fast result"

    @tool
    async def slow(ctx: ToolContext) -> str:
        """Slow."""
        await fast_committed.wait()
        effects.append(f"slow {ctx.call_id}")
        return "slow result"

    return Agent(name="a", tools=[fast, slow]), fast_committed, on_event


async def test_the_last_result_commits_with_the_results_message(tmp_path: Path) -> None:
    effects: list[str] = []
    agent, _, on_event = _two_tools(effects)
    store, transactions = await traced_store(tmp_path / "db")
    with anyio.fail_after(20):
        async with Runtime(store=store, model=_model("fast", "slow"), on_event=on_event) as rt:
            result = await rt.run(agent, "go")
    await store.close()
    assert result.output == "done: fast result | slow result"
    # the first to finish is committed alone, at once; the last with the user turn
    assert not any("INSERT INTO messages" in s for s in _finishing(transactions, "toolu_fast"))
    last = _finishing(transactions, "toolu_slow")
    assert [s for s in last if "INSERT INTO messages" in s and "'user'" in s]
    # and the next call's row: committed before that call is sent (write-ahead)
    assert [s for s in last if "INSERT INTO calls" in s]
    inserts = [s for t in transactions for s in t if "INSERT INTO messages" in s]
    assert len([s for s in inserts if "'user'" in s]) == 2  # the task, the results: once
    calls = [s for t in transactions for s in t if "INSERT INTO calls" in s]
    assert len(calls) == 2  # the first call, the one after the tools


class _StopsBeforeTheLastCommit(SQLiteStore):
    """The real store; the process "dies" just before a tool turn's last commit (with the
    results message, and the next call's row when it can be built at once), or just after
    it (``after``)."""

    reached = anyio.Event()
    after = False

    async def _stop(self) -> None:
        self.reached.set()
        await anyio.sleep_forever()

    async def begin_call(
        self,
        call: CallRecord,
        messages: Sequence[MessageRecord],
        *,
        tool_event: ToolEventRecord | None = None,
        spills: Sequence[SpillRecord] = (),
    ) -> int:
        if tool_event is not None and not self.after:
            await self._stop()
        call_id = await super().begin_call(call, messages, tool_event=tool_event, spills=spills)
        if tool_event is not None:
            await self._stop()
        return call_id

    async def record_tool_event(
        self,
        event: ToolEventRecord,
        *,
        spills: Sequence[SpillRecord] = (),
        messages: Sequence[MessageRecord] = (),
    ) -> None:
        if messages and not self.after:
            await self._stop()
        await super().record_tool_event(event, spills=spills, messages=messages)


async def _run_to_the_stop(
    tmp_path: Path, stops: type[_StopsBeforeTheLastCommit]
) -> tuple[list[str], Path, str]:
    """Run the two-tool session on a store that "dies" at ``stops``' point; the tools'
    effects so far, the database and the session to resume."""
    effects: list[str] = []
    agent, _, on_event = _two_tools(effects)
    db = tmp_path / "db"
    stops.reached = reached = anyio.Event()
    store = await stops.open(db)
    with anyio.fail_after(20):
        async with Runtime(store=store, model=_model("fast", "slow"), on_event=on_event) as rt:
            session_id = await run_until(rt, agent, "go", reached)
    await store.close()
    return effects, db, session_id


async def test_a_stop_before_the_last_commit_runs_only_the_last_call_again(tmp_path: Path) -> None:
    effects, db, session_id = await _run_to_the_stop(tmp_path, _StopsBeforeTheLastCommit)
    agent, fast_committed, on_event = _two_tools(effects)
    fast_committed.set()  # committed before the stop
    async with Runtime(db, model=_model("fast", "slow"), on_event=on_event) as rt:
        with anyio.fail_after(20):
            result = await rt.resume(session_id, agent)
        events = await _events(rt)
        turns = await sql(rt.store, "SELECT seq FROM messages WHERE role = 'user' ORDER BY seq")
    # fast's result was committed: not run again; slow's was not: run again, same call id
    assert effects == ["fast toolu_fast", "slow toolu_slow", "slow toolu_slow"]
    assert result.output == "done: fast result | slow result"
    finished = [e["call_id"] for e in events if e["event"] == "finished"]
    assert finished == ["toolu_fast", "toolu_slow"]
    assert [t["seq"] for t in turns] == [0, 2]


class _StopsAfterTheLastCommit(_StopsBeforeTheLastCommit):
    """The process "dies" once a tool turn's last result, its results message and the
    next call's row are committed, before that call is sent."""

    after = True


async def test_a_stop_after_the_last_commit_sends_the_next_call_again_and_runs_no_tool(
    tmp_path: Path,
) -> None:
    effects, db, session_id = await _run_to_the_stop(tmp_path, _StopsAfterTheLastCommit)
    agent, fast_committed, on_event = _two_tools(effects)
    fast_committed.set()
    async with Runtime(db, model=_model("fast", "slow"), on_event=on_event) as rt:
        with anyio.fail_after(20):
            result = await rt.resume(session_id, agent)
        calls = await rt.store.list_calls(result.run_id or "")
        turns = await sql(rt.store, "SELECT seq FROM messages WHERE role = 'user' ORDER BY seq")
    assert effects == ["fast toolu_fast", "slow toolu_slow"]  # both committed: none again
    assert result.output == "done: fast result | slow result"
    # the call committed with the last result was cut off unsent; resume sends the same
    # request (same fingerprint, same messages) as the next attempt's row
    assert [(c.turn, c.status) for c in calls] == [(1, "ok"), (2, "interrupted"), (2, "ok")]
    assert calls[1].fingerprint == calls[2].fingerprint
    assert calls[1].message_count == calls[2].message_count == 3
    assert [t["seq"] for t in turns] == [0, 2]


class _BrokenIngest(PassThroughPipeline):
    """A pipeline whose ingest fails (a bug of its own), with or without an await."""

    def ingest_now(self, run: ContextView, call: ToolUseBlock, outcome: ToolOutcome) -> Ingested:
        raise RuntimeError("ingest bug")

    async def ingest(self, run: ContextView, call: ToolUseBlock, outcome: ToolOutcome) -> Ingested:
        raise RuntimeError("ingest bug")


async def test_a_failing_ingest_still_commits_the_result_first(tmp_path: Path) -> None:
    runs: list[str] = []

    @tool
    async def pay(ctx: ToolContext) -> str:
        """Pay."""
        runs.append(ctx.call_id)
        return "paid"

    agent = Agent(name="a", tools=[pay])
    db = tmp_path / "db"
    async with Runtime(db, model=_model("pay"), pipeline=_BrokenIngest()) as rt:
        with anyio.fail_after(20):
            failed = await rt.run(agent, "go")
    assert failed.status == "failed" and "ingest bug" in (failed.error or "")
    async with Runtime(db, model=_model("pay")) as rt:
        with anyio.fail_after(20):
            result = await rt.resume(failed.session_id, agent)
    assert runs == ["toolu_pay"]  # committed before the ingest failed: not run again
    assert result.output == "done: paid"
