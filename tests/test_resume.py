"""Resume semantics, one test per rule, with the process "stopped" at an exact point.

A stop is simulated in-process by cancelling the run at the point under test: like a crash,
a cancellation commits nothing the run had not committed already (every store write is one
shielded transaction), so the store is left exactly as a ``kill -9`` there would leave it,
apart from the session's ``cancelled`` event and the released lease. Real ``SIGKILL``s are
in ``tests/crash/``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from anabranch import Agent, Runtime, ToolContext, tool
from anabranch.errors import LeaseLostError, SessionBusyError
from anabranch.messages import (
    Block,
    ModelRequest,
    ToolResultBlock,
    ToolUseBlock,
)
from anabranch.models._retry import RetryPolicy
from anabranch.runtime._builtins import ToolOutcome
from anabranch.runtime._context_view import ContextView, Ingested
from anabranch.runtime._loop import INTERRUPTED_REPORT, AgentRun
from anabranch.runtime._pipeline import PassThroughPipeline
from anabranch.store.sqlite._rows import hex_text
from anabranch.testing import FunctionModel
from tests.databases import Db, rows, table_counts

from .helpers import wait_until

pytestmark = pytest.mark.anyio

FAST = RetryPolicy(base_delay=0.0, max_delay=0.0)


class Script:
    """A scripted model: turn 1 calls ``calls``; turn 2 answers with the results it saw.

    ``block_on`` names a request number (1-based, counted across processes sharing this
    object) at which the model signals ``reached`` and never answers.
    """

    def __init__(self, calls: list[tuple[str, str, dict[str, Any]]], block_on: int = 0):
        self.calls = calls
        self.block_on = block_on
        self.reached = anyio.Event()
        self.count = 0

    def model(self) -> FunctionModel:
        return FunctionModel(self.respond)

    async def respond(self, request: ModelRequest) -> list[Block] | str:
        self.count += 1
        if self.count == self.block_on:
            self.reached.set()
            await anyio.sleep_forever()
        last = request.messages[-1]
        if not self.calls:
            return f"hello, {last.text}"
        if not last.tool_results:
            return [ToolUseBlock(id=i, name=n, input=a) for i, n, a in self.calls]
        return "answer: " + "; ".join(
            f"{r.tool_use_id}={'ERR' if r.is_error else r.content}" for r in last.tool_results
        )


async def stop_at(
    db: Db,
    agent: Agent,
    task: str,
    model: FunctionModel,
    reached: anyio.Event,
    **runtime_options: Any,
) -> str:
    """Run ``agent`` until ``reached`` is set, then stop everything there. Returns the id."""
    ids: list[str] = []
    async with Runtime(db=db, model=model, retry=FAST, **runtime_options) as rt:
        async with anyio.create_task_group() as group:

            async def run() -> None:
                await rt.run(agent, task, on_session=ids.append)

            group.start_soon(run)
            await reached.wait()
            group.cancel_scope.cancel()
    assert ids, "the session was never created"
    return ids[0]


def transcript(db: Db, session_id: str) -> list[tuple[str, str]]:
    return rows(
        db,
        "SELECT m.role, m.content FROM messages m JOIN runs r ON r.id = m.run_id "
        "WHERE r.session_id = ? ORDER BY r.created, m.seq",
        (session_id,),
    )


class Effects:
    """Side effects of the test tools, keyed by call id (what a real tool would dedupe on)."""

    def __init__(self) -> None:
        self.invocations: list[tuple[str, str]] = []
        self.done: dict[str, str] = {}

    def tool(
        self,
        name: str,
        *,
        gate: Callable[[ToolContext], Awaitable[None]] | None = None,
        on_interrupt: Any = "retry",
    ) -> Any:
        effects = self

        async def run(key: str, ctx: ToolContext) -> str:
            effects.invocations.append((name, ctx.call_id))
            if gate is not None:
                await gate(ctx)
            effects.done.setdefault(ctx.call_id, f"{name}:{key}")
            return f"{name}({key}) ok"

        run.__name__ = name
        run.__doc__ = f"The {name} tool."
        return tool(on_interrupt=on_interrupt)(run)


# ---------------------------------------------------------------- a request in flight


async def test_request_in_flight_is_sent_again_identically(db: Db) -> None:
    effects = Effects()
    agent = Agent(name="worker", tools=[effects.tool("fetch")], instructions="Be brief.")
    script = Script([("toolu_a", "fetch", {"key": "x"})], block_on=2)
    before = script.model()
    session_id = await stop_at(db, agent, "do it", before, script.reached)

    in_flight = rows(
        db,
        "SELECT c.id, c.fingerprint FROM calls c LEFT JOIN call_outcomes o ON o.call_id = c.id "
        "WHERE o.call_id IS NULL",
    )
    assert len(in_flight) == 1

    after = script.model()
    async with Runtime(db=db, model=after, retry=FAST, agents=[agent]) as rt:
        result = await rt.resume(session_id)

    assert result.status == "done"
    assert result.output == "answer: toolu_a=fetch(x) ok"
    # Byte-identical: same snapshot, same messages, same parameters (cache-friendly).
    assert after.requests[0] == before.requests[-1]
    stored = in_flight[0][1]  # SQLite keeps the digest as its 32 bytes
    assert after.requests[0].fingerprint() == hex_text(stored)
    # The cut-off call is closed as interrupted, and the tool did not run again.
    outcome = rows(db, "SELECT status FROM call_outcomes WHERE call_id = ?", (in_flight[0][0],))
    assert outcome == [("interrupted",)]
    assert effects.invocations == [("fetch", "toolu_a")]
    roles = [role for role, _ in transcript(db, session_id)]
    assert roles == ["user", "assistant", "user", "assistant"]


async def test_first_request_in_flight_is_sent_again(db: Db) -> None:
    agent = Agent(name="worker")
    script = Script([], block_on=1)
    before = script.model()
    session_id = await stop_at(db, agent, "say hi", before, script.reached)
    after = script.model()
    async with Runtime(db=db, model=after, retry=FAST, agents=[agent]) as rt:
        result = await rt.resume(session_id)
    assert after.requests == before.requests
    assert result.output == "hello, say hi"
    assert [r for r, _ in transcript(db, session_id)] == ["user", "assistant"]


# ---------------------------------------------------------------- tools partly done


async def test_only_missing_tools_run_again_with_the_same_call_ids(db: Db) -> None:
    effects = Effects()
    reached = anyio.Event()
    first_process = True

    async def slow_gate(ctx: ToolContext) -> None:
        # Stop only once the two fast tools' results are committed.
        if not first_process:
            return
        async with Runtime(db=db) as rt:  # a second connection, as another reader would

            async def both_committed() -> bool:
                events = await rt.store.tool_events(ctx.run_id, ["toolu_a", "toolu_b"])
                return sum(e.event == "finished" for e in events) == 2

            await wait_until(both_committed)
        reached.set()
        await anyio.sleep_forever()

    agent = Agent(
        name="worker",
        tools=[effects.tool("fast"), effects.tool("slow", gate=slow_gate)],
    )
    calls = [
        ("toolu_a", "fast", {"key": "1"}),
        ("toolu_c", "slow", {"key": "3"}),
        ("toolu_b", "fast", {"key": "2"}),
    ]
    script = Script(calls)
    session_id = await stop_at(db, agent, "go", script.model(), reached)
    assert sorted(effects.invocations) == [
        ("fast", "toolu_a"),
        ("fast", "toolu_b"),
        ("slow", "toolu_c"),
    ]

    first_process = False
    after = script.model()
    async with Runtime(db=db, model=after, retry=FAST, agents=[agent]) as rt:
        result = await rt.resume(session_id)

    # Only the unfinished tool ran again, with its original call id.
    assert sorted(effects.invocations) == [
        ("fast", "toolu_a"),
        ("fast", "toolu_b"),
        ("slow", "toolu_c"),
        ("slow", "toolu_c"),
    ]
    # Results come back in tool_use order, as one user message.
    assert result.output == "answer: toolu_a=fast(1) ok; toolu_c=slow(3) ok; toolu_b=fast(2) ok"
    assert [r.tool_use_id for r in after.requests[0].messages[-1].tool_results] == [
        "toolu_a",
        "toolu_c",
        "toolu_b",
    ]


class StopBeforeResults(PassThroughPipeline):
    """Stops the run after every tool finished, before the results message is committed."""

    def __init__(self) -> None:
        self.reached = anyio.Event()

    async def ingest(self, run: ContextView, call: ToolUseBlock, outcome: ToolOutcome) -> Ingested:
        self.reached.set()
        await anyio.sleep_forever()
        return Ingested(outcome)  # pragma: no cover


async def test_finished_tools_never_run_again(db: Db) -> None:
    effects = Effects()
    agent = Agent(name="worker", tools=[effects.tool("pay"), effects.tool("mail")])
    script = Script([("toolu_p", "pay", {"key": "10"}), ("toolu_m", "mail", {"key": "bob"})])
    pipeline = StopBeforeResults()
    session_id = await stop_at(
        db, agent, "pay and mail", script.model(), pipeline.reached, pipeline=pipeline
    )
    # Both results are committed, the message carrying them is not.
    assert [r for r, _ in transcript(db, session_id)] == ["user", "assistant"]
    assert len(rows(db, "SELECT * FROM tool_events WHERE event = 'finished'")) == 2

    after = script.model()
    async with Runtime(db=db, model=after, retry=FAST, agents=[agent]) as rt:
        result = await rt.resume(session_id)
    assert sorted(effects.invocations) == [("mail", "toolu_m"), ("pay", "toolu_p")]
    assert result.output == "answer: toolu_p=pay(10) ok; toolu_m=mail(bob) ok"
    assert len(after.requests) == 1


# ---------------------------------------------------------------- on_interrupt


async def _stop_mid_tool(
    db: Db, on_interrupt: str
) -> tuple[str, Effects, Agent, Script, list[str]]:
    effects = Effects()
    reached = anyio.Event()
    blocking = [True]
    call_ids: list[str] = []

    async def gate(ctx: ToolContext) -> None:
        call_ids.append(ctx.call_id)
        if blocking[0]:
            reached.set()
            await anyio.sleep_forever()

    agent = Agent(name="payer", tools=[effects.tool("pay", gate=gate, on_interrupt=on_interrupt)])
    script = Script([("toolu_pay", "pay", {"key": "42"})])
    session_id = await stop_at(db, agent, "pay 42", script.model(), reached)
    blocking[0] = False
    return session_id, effects, agent, script, call_ids


async def test_interrupted_tool_retry_runs_again_with_same_call_id(db: Db) -> None:
    session_id, effects, agent, script, call_ids = await _stop_mid_tool(db, "retry")
    async with Runtime(db=db, model=script.model(), retry=FAST, agents=[agent]) as rt:
        result = await rt.resume(session_id)
    assert call_ids == ["toolu_pay", "toolu_pay"]
    assert effects.done == {"toolu_pay": "pay:42"}
    assert result.output == "answer: toolu_pay=pay(42) ok"


async def test_interrupted_tool_report_tells_the_model(db: Db) -> None:
    session_id, effects, agent, script, call_ids = await _stop_mid_tool(db, "report")
    after = script.model()
    async with Runtime(db=db, model=after, retry=FAST, agents=[agent]) as rt:
        result = await rt.resume(session_id)
    assert call_ids == ["toolu_pay"]  # not run again
    assert result.output == "answer: toolu_pay=ERR"
    (block,) = after.requests[0].messages[-1].tool_results
    assert block == ToolResultBlock(
        tool_use_id="toolu_pay", content=INTERRUPTED_REPORT, is_error=True
    )
    assert "interrupted" in block.content and "unknown" in block.content


# ---------------------------------------------------------------- finished sessions


def _refuse(request: ModelRequest) -> str:
    raise AssertionError("the model must not be called")


async def test_resuming_a_finished_session_does_not_call_the_model(db: Db) -> None:
    effects = Effects()
    agent = Agent(name="worker", tools=[effects.tool("fetch")])
    script = Script([("toolu_a", "fetch", {"key": "x"})])
    async with Runtime(db=db, model=script.model(), retry=FAST) as rt:
        first = await rt.run(agent, "go")
    counts = table_counts(db)
    async with Runtime(db=db, model=FunctionModel(_refuse), agents=[agent]) as rt:
        again = await rt.resume(first.session_id)
    assert again == first
    assert table_counts(db) == counts
    assert effects.invocations == [("fetch", "toolu_a")]


async def test_stop_after_the_answer_was_committed(db: Db) -> None:
    """The root's answer is committed but the session was not marked done yet (its end
    goes with the lease's release: the process stops before that transaction)."""
    agent = Agent(name="worker")
    ids: list[str] = []

    class Stopped(Exception):
        pass

    async with Runtime(db=db, model=FunctionModel(lambda r: "the answer"), retry=FAST) as rt:
        store = rt.store
        original = store.release_lease

        async def stop_at_done(session_id: str, owner: str, **kwargs: Any) -> None:
            if kwargs.get("status") == "done":
                raise Stopped  # nothing of this transaction is written
            await original(session_id, owner, **kwargs)

        store.release_lease = stop_at_done  # type: ignore[method-assign]
        with pytest.raises(Stopped):
            await rt.run(agent, "question", on_session=ids.append)
        assert await rt.store.lease_holder(ids[0]) is None  # given back all the same
        session = await rt.store.get_session(ids[0])
        assert session is not None and session.status == "running"
    assert rows(db, "SELECT status, output FROM run_ends") == [("done", "the answer")]

    async with Runtime(db=db, model=FunctionModel(_refuse), agents=[agent]) as rt:
        result = await rt.resume(ids[0])
        session = await rt.store.get_session(ids[0])
    assert (result.status, result.output) == ("done", "the answer")
    assert session is not None and session.status == "done"


# ---------------------------------------------------------------- token accounting


class Probe(PassThroughPipeline):
    """Records what the live run knew before each call; stops before call ``stop_on``."""

    def __init__(self, stop_on: int) -> None:
        self.stop_on = stop_on
        self.seen: list[tuple[int, Any, int]] = []
        self.reached = anyio.Event()

    async def before_call(self, run: ContextView) -> None:
        assert isinstance(run, AgentRun)
        self.seen.append((run.context_tokens, run.last_usage, len(run.appended_since_usage)))
        if len(self.seen) == self.stop_on:
            self.reached.set()
            await anyio.sleep_forever()


async def test_resumed_run_counts_tokens_like_the_live_run(db: Db) -> None:
    """Compaction decisions after resume must match an uninterrupted run's."""
    effects = Effects()
    agent = Agent(name="worker", tools=[effects.tool("fetch")])
    script = Script([("toolu_a", "fetch", {"key": "x" * 300})])
    probe = Probe(stop_on=2)
    session_id = await stop_at(db, agent, "go", script.model(), probe.reached, pipeline=probe)
    live_tokens, live_usage, live_appended = probe.seen[-1]
    assert live_usage is not None

    async with Runtime(db=db, model=script.model(), agents=[agent]) as rt:
        (record,) = await rt.store.list_runs(session_id)
        loaded = await AgentRun.load(rt.environment(session_id), agent, record)
    assert loaded.last_usage == live_usage
    assert len(loaded.appended_since_usage) == live_appended
    assert loaded.context_tokens == live_tokens


# ---------------------------------------------------------------- leases


async def test_a_live_session_cannot_be_resumed_twice(db: Db) -> None:
    agent = Agent(name="worker")
    script = Script([], block_on=1)
    ids: list[str] = []
    async with Runtime(db=db, model=script.model(), retry=FAST) as owner:
        async with anyio.create_task_group() as group:

            async def run() -> None:
                await owner.run(agent, "q", on_session=ids.append)

            group.start_soon(run)
            await script.reached.wait()
            async with Runtime(db=db, model=FunctionModel(_refuse), agents=[agent]) as other:
                with pytest.raises(SessionBusyError, match="another live process"):
                    await other.resume(ids[0])
            with pytest.raises(SessionBusyError):  # nor from the runtime driving it
                await owner.resume(ids[0])
            group.cancel_scope.cancel()


async def test_an_expired_lease_is_taken_over(db: Db) -> None:
    agent = Agent(name="worker")
    script = Script([], block_on=1)
    session_id = await stop_at(db, agent, "q", script.model(), script.reached)
    async with Runtime(db=db) as rt:  # an owner on another host that went silent
        await rt.store.acquire_lease(session_id, "elsewhere:1:dead", ttl=-1.0)
    async with Runtime(db=db, model=script.model(), retry=FAST, agents=[agent]) as rt:
        result = await rt.resume(session_id)
    assert result.status == "done"


async def test_a_lost_lease_stops_the_process(db: Db) -> None:
    reached = anyio.Event()

    async def wait(ctx: ToolContext) -> None:
        reached.set()
        await anyio.sleep_forever()

    effects = Effects()
    agent = Agent(name="worker", tools=[effects.tool("wait", gate=wait)])
    script = Script([("toolu_w", "wait", {"key": "k"})])
    ids: list[str] = []
    errors: list[Exception] = []
    async with Runtime(db=db, model=script.model(), retry=FAST, lease_ttl=0.15) as rt:
        async with anyio.create_task_group() as group:

            async def run() -> None:
                try:
                    await rt.run(agent, "q", on_session=ids.append)
                except LeaseLostError as exc:
                    errors.append(exc)

            group.start_soon(run)
            await reached.wait()
            # Another process took the session over after this one stalled.
            rows(db, "UPDATE leases SET owner = 'thief', expires = 1e12")
    assert len(errors) == 1 and "taken over" in str(errors[0])
    statuses = rows(db, "SELECT status FROM session_events ORDER BY id")
    assert statuses == [("running",)]  # nothing written after the loss
    assert rows(db, "SELECT owner FROM leases") == [("thief",)]
