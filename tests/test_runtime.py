"""The agent loop: tools, turns, persistence before every call, cancellation, concurrency."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import anyio
import pytest

from anabranch import Agent, RetryPolicy, Runtime, ToolContext, tool
from anabranch.context._pairing import pairing_violations
from anabranch.context._tokens import estimate_request
from anabranch.errors import (
    MaxTurnsExceeded,
    ModelConnectionError,
    OverloadedError,
    PromptTooLongError,
    RateLimitedError,
)
from anabranch.messages import Message, ModelRequest, TextBlock
from anabranch.runtime._history import load_messages
from anabranch.testing import FunctionModel, TestModel

from .helpers import call, failed_with, script, wait_until

pytestmark = pytest.mark.anyio

FAST_RETRY = RetryPolicy(max_attempts=4, base_delay=0.0, max_delay=0.0)


@tool
async def echo(text: str, ctx: ToolContext) -> str:
    """Echo the text back with the call id."""
    return f"{text} ({ctx.call_id}, {ctx.run_id}, {ctx.session_id})"


@tool
def shout(text: str) -> str:
    """Upper-case the text (sync tool)."""
    return text.upper()


@tool
async def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(f"boom: {reason}")


@tool(timeout=0.05)
async def stall(seconds: float) -> str:
    """Sleep for a while."""
    await anyio.sleep(seconds)
    return "finished"


def _agent(**kwargs: object) -> Agent:
    defaults: dict[str, object] = {
        "name": "worker",
        "model": "test-model",
        "instructions": "Work.",
        "tools": [echo, shout, explode, stall],
    }
    defaults.update(kwargs)
    return Agent(**defaults)


def _rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


async def test_test_model_runs_every_tool_then_reports(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    model = TestModel()
    async with Runtime(db=db, model=model) as rt:
        result = await rt.run(_agent(tools=[echo, shout]), "say hi")
    assert result.status == "done"
    assert result.output.startswith("Report on: say hi")
    assert "echo (ok)" in result.output and "shout (ok)" in result.output
    assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0
    assert len(model.requests) == 2
    assert [m.role for m in model.requests[1].messages] == ["user", "assistant", "user"]


async def test_tool_results_errors_and_timeouts_reach_the_model(tmp_path: Path) -> None:
    calls = [
        call("echo", text="hi"),
        call("shout", text="hey"),
        call("explode", reason="bad day"),
        call("stall", seconds=5),
        call("echo", wrong_field=1),
        call("nonexistent"),
    ]
    model = FunctionModel(script(calls, "done"))
    async with Runtime(db=tmp_path / "r.db", model=model) as rt:
        result = await rt.run(_agent(), "go")
    assert result.output == "done"
    results = model.requests[1].messages[-1].tool_results
    assert [r.tool_use_id for r in results] == [c.id for c in calls]
    by_id = {r.tool_use_id: r for r in results}
    echo_result = by_id[calls[0].id]
    assert not echo_result.is_error
    assert echo_result.content.startswith(f"hi ({calls[0].id}, run_")
    assert result.session_id in echo_result.content
    assert by_id[calls[1].id].content == "HEY"
    assert by_id[calls[2].id].is_error and "boom: bad day" in by_id[calls[2].id].content
    assert by_id[calls[3].id].is_error and "timed out" in by_id[calls[3].id].content
    invalid = by_id[calls[4].id]
    assert invalid.is_error and "Invalid arguments" in invalid.content and "text" in invalid.content
    unknown = by_id[calls[5].id]
    assert unknown.is_error and "Unknown tool 'nonexistent'" in unknown.content
    assert not pairing_violations(model.requests[1].messages)


async def test_parallel_tool_calls_overlap(tmp_path: Path) -> None:
    both_started = anyio.Event()
    started = 0

    @tool
    async def rendezvous(name: str) -> str:
        """Wait until both calls are running at the same time."""
        nonlocal started
        started += 1
        if started == 2:
            both_started.set()
        with anyio.fail_after(5):  # would time out if the calls ran one after the other
            await both_started.wait()
        return name

    model = FunctionModel(
        script([call("rendezvous", name="a"), call("rendezvous", name="b")], "ok")
    )
    async with Runtime(db=tmp_path / "r.db", model=model) as rt:
        result = await rt.run(_agent(tools=[rendezvous]), "go")
    assert result.output == "ok"
    contents = [r.content for r in model.requests[1].messages[-1].tool_results]
    assert contents == ["a", "b"]


async def test_max_turns_is_a_clear_failure(tmp_path: Path) -> None:
    model = FunctionModel(lambda request: [call("shout", text="again")])
    db = tmp_path / "r.db"
    async with Runtime(db=db, model=model) as rt:
        info = failed_with(
            await rt.run(_agent(max_turns=3, on_limit="fail"), "loop forever"),
            MaxTurnsExceeded,
            match="max_turns=3",
        )
        session_id = info.session_id
        assert session_id is not None
        again = await rt.resume(session_id)
    assert again.status == "failed" and "max_turns=3" in (again.error or "")
    assert len(model.requests) == 3


async def test_everything_is_committed_before_each_request(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    seen: list[tuple[int, int, int]] = []

    async def check_store(request: ModelRequest) -> list[object]:
        # At the moment the request "leaves the process", the store already holds every
        # message the request carries and an unanswered call row for it.
        messages = _rows(db, "SELECT role, run_id FROM messages ORDER BY id")
        open_calls = _rows(
            db,
            "SELECT c.message_count FROM calls c LEFT JOIN call_outcomes o ON o.call_id = c.id "
            "WHERE o.call_id IS NULL",
        )
        assert len(messages) == len(request.messages)
        _, stored = await load_messages(rt.store, str(messages[0][1]))
        for (role, _), message, sent in zip(messages, stored, request.messages, strict=True):
            assert role == sent.role
            assert message.model_dump(mode="json") == sent.model_dump(mode="json")
        assert open_calls == [(len(request.messages),)]
        seen.append((len(messages), len(open_calls), len(request.messages)))
        return [call("echo", text="x")] if len(seen) == 1 else [TextBlock(text="end")]

    @tool
    async def echo(text: str) -> str:
        """Check the assistant turn is committed before the tool runs."""
        rows = _rows(db, "SELECT role FROM messages ORDER BY seq DESC LIMIT 1")
        assert rows == [("assistant",)]
        outcomes = _rows(
            db, "SELECT status, usage FROM call_outcomes ORDER BY call_id DESC LIMIT 1"
        )
        assert outcomes[0][0] == "ok" and "input_tokens" in str(outcomes[0][1])
        return text

    async with Runtime(db=db, model=FunctionModel(check_store)) as rt:
        result = await rt.run(_agent(tools=[echo]), "persist first")
    assert result.output == "end"
    assert seen == [(1, 1, 1), (3, 1, 3)]


APPEND_ONLY_TABLES = (
    "sessions",
    "session_events",
    "runs",
    "run_ends",
    "messages",
    "calls",
    "call_outcomes",
    "tool_events",
    "snapshots",
    "boundaries",
    "spills",
    "tenant_spend",
    "session_budgets",
)


async def test_store_is_append_only(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    async with Runtime(db=db) as rt:  # creates the schema
        pass
    conn = sqlite3.connect(db)
    for table in APPEND_ONLY_TABLES:
        for action in ("UPDATE", "DELETE"):
            conn.execute(
                f"CREATE TRIGGER no_{action.lower()}_{table} BEFORE {action} ON {table} "
                f"BEGIN SELECT RAISE(ABORT, '{action} on {table}'); END"
            )
    conn.commit()
    conn.close()
    errors = [OverloadedError("busy")]

    def model_fn(request: ModelRequest) -> list[object]:
        if errors:
            raise errors.pop(0)
        if len(request.messages) == 1:
            return [call("shout", text="a"), call("echo", text="b")]
        return [TextBlock(text="end")]

    model = FunctionModel(model_fn)
    async with Runtime(db=db, model=model, retry=FAST_RETRY) as rt:
        first = await rt.run(_agent(), "one")
        again = await rt.resume(first.session_id)
    assert again.output == first.output == "end"
    seqs = [r[0] for r in _rows(db, "SELECT seq FROM messages ORDER BY id")]
    assert seqs == list(range(4))


async def test_database_is_owner_only_and_wal(tmp_path: Path) -> None:
    db = tmp_path / "private.db"
    async with Runtime(db=db, model=TestModel()) as rt:
        await rt.run(_agent(tools=[shout]), "x")
        mode = stat.S_IMODE(os.stat(db).st_mode)
        assert mode == 0o600
        for suffix in ("-wal", "-shm"):
            side = Path(str(db) + suffix)
            if side.exists():
                assert stat.S_IMODE(os.stat(side).st_mode) & 0o077 == 0
    assert _rows(db, "PRAGMA journal_mode") == [("wal",)]


async def test_retryable_errors_are_retried_and_recorded(tmp_path: Path) -> None:
    errors = [
        RateLimitedError("slow down", status_code=429, retry_after=0.0),
        OverloadedError("Overloaded", status_code=200, error_type="overloaded_error"),
        ModelConnectionError("dropped"),
    ]

    def flaky(request: ModelRequest) -> str:
        if errors:
            raise errors.pop(0)
        return "made it"

    db = tmp_path / "r.db"
    async with Runtime(db=db, model=FunctionModel(flaky), retry=FAST_RETRY) as rt:
        result = await rt.run(_agent(), "retry me")
    assert result.output == "made it"
    attempts = _rows(
        db,
        "SELECT c.attempt, o.status, o.error_type FROM calls c "
        "JOIN call_outcomes o ON o.call_id = c.id ORDER BY c.id",
    )
    assert attempts == [
        (1, "error", "RateLimitedError"),
        (2, "error", "OverloadedError"),
        (3, "error", "ModelConnectionError"),
        (4, "ok", None),
    ]


def test_retry_after_is_honoured() -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=8)
    assert policy.delay(1, RateLimitedError("x", retry_after=7.5)) == 7.5
    assert policy.delay(1, RateLimitedError("x", retry_after=9999)) == policy.max_retry_after
    backoff = policy.delay(3, OverloadedError("x"))
    assert 1.5 <= backoff <= 2.0  # 0.5 * 2**2 with up to 25% jitter off
    assert not policy.should_retry(
        1, PromptTooLongError("prompt is too long: 5 tokens > 4 maximum")
    )
    assert not policy.should_retry(policy.max_attempts, OverloadedError("x"))


async def test_exhausted_retries_leave_the_session_resumable(tmp_path: Path) -> None:
    failing = True

    def sometimes(request: ModelRequest) -> str:
        if failing:
            raise OverloadedError("Overloaded")
        return "recovered"

    db = tmp_path / "r.db"
    model = FunctionModel(sometimes)
    async with Runtime(db=db, model=model, retry=FAST_RETRY) as rt:
        info = failed_with(await rt.run(_agent(), "flaky"), OverloadedError)
        session_id = info.session_id
        assert session_id
        failing = False
        result = await rt.resume(session_id)
    assert result.output == "recovered"
    assert len(model.requests) == FAST_RETRY.max_attempts + 1
    # the resend is byte-identical to the failed request
    assert model.requests[-1].fingerprint() == model.requests[0].fingerprint()


async def test_prompt_too_long_is_parsed() -> None:
    error = PromptTooLongError("prompt is too long: 200251 tokens > 200000 maximum")
    assert (error.tokens, error.maximum) == (200251, 200000)


async def test_cancellation_leaves_a_consistent_resumable_store(tmp_path: Path) -> None:
    release = anyio.Event()
    entered = anyio.Event()
    runs = 0

    @tool
    async def slow(name: str) -> str:
        """Block until released."""
        nonlocal runs
        runs += 1
        entered.set()
        await release.wait()
        return f"slow {name}"

    @tool
    async def quick(name: str) -> str:
        """Finish at once."""
        return f"quick {name}"

    agent = _agent(tools=[slow, quick])
    turns = [call("quick", name="q"), call("slow", name="s")]
    model = FunctionModel(script(turns, "all done"))
    db = tmp_path / "r.db"
    async with Runtime(db=db, model=model) as rt:
        session_ids: list[str] = []
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                group.start_soon(lambda: rt.run(agent, "cancel me", on_session=session_ids.append))
                await entered.wait()

                async def quick_committed() -> bool:
                    (root,) = await rt.store.list_runs(session_ids[0])
                    events = await rt.store.tool_events(root.id, [turns[0].id])
                    return any(e.event == "finished" for e in events)

                await wait_until(quick_committed)
                scope.cancel()
        (session_id,) = session_ids
        status = _rows(db, "SELECT status FROM session_events ORDER BY id DESC LIMIT 1")
        assert status == [("cancelled",)]
        finished = _rows(db, "SELECT call_id FROM tool_events WHERE event = 'finished'")
        assert finished == [(turns[0].id,)]
        release.set()
        result = await rt.resume(session_id, agent=agent)
    assert result.output == "all done"
    # quick ran once (its result was committed), slow was run again (on_interrupt="retry")
    assert runs == 2
    results = model.requests[-1].messages[-1].tool_results
    assert [r.content for r in results] == ["quick q", "slow s"]


async def test_fifty_concurrent_runs_share_one_file(tmp_path: Path) -> None:
    db = tmp_path / "busy.db"
    agent = _agent(tools=[echo, shout])
    results = []
    async with Runtime(db=db, model=TestModel(rounds=2)) as rt:

        async def one(i: int) -> None:
            results.append(await rt.run(agent, f"task {i}"))

        async with anyio.create_task_group() as group:
            for i in range(50):
                group.start_soon(one, i)
    assert len(results) == 50 and all(r.status == "done" for r in results)
    assert _rows(db, "SELECT COUNT(DISTINCT session_id) FROM runs") == [(50,)]
    # every run: task, 2 tool rounds (assistant + results each), final answer
    counts = _rows(db, "SELECT run_id, COUNT(*) FROM messages GROUP BY run_id")
    assert {n for _, n in counts} == {6}
    errors = _rows(db, "SELECT COUNT(*) FROM call_outcomes WHERE status = 'error'")
    assert errors == [(0,)]


async def test_resuming_a_finished_session_does_not_call_the_model(tmp_path: Path) -> None:
    model = TestModel()
    async with Runtime(db=tmp_path / "r.db", model=model) as rt:
        first = await rt.run(_agent(tools=[shout]), "once")
        calls = len(model.requests)
        again = await rt.resume(first.session_id)
    assert again.output == first.output and again.status == "done"
    assert again.usage == first.usage
    assert len(model.requests) == calls


async def test_resume_in_a_new_process_finds_the_agent_or_says_how(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    agent = _agent(tools=[shout])
    model = FunctionModel(lambda r: (_ for _ in ()).throw(OverloadedError("down")))
    async with Runtime(db=db, model=model, retry=FAST_RETRY) as rt:
        info = failed_with(await rt.run(agent, "x"), OverloadedError)
    session_id = info.session_id
    assert session_id
    async with Runtime(db=db, model=TestModel()) as fresh:
        from anabranch.errors import UserError

        with pytest.raises(UserError, match="cannot find agent 'worker'"):
            await fresh.resume(session_id)
        result = await fresh.resume(session_id, agent=agent)
    assert result.status == "done"


async def test_usage_is_summed_over_calls(tmp_path: Path) -> None:
    model = TestModel()
    async with Runtime(db=tmp_path / "r.db", model=model) as rt:
        result = await rt.run(_agent(tools=[shout]), "count tokens")
    assert result.usage.input_tokens == sum(estimate_request(r) for r in model.requests)
    async with Runtime(db=tmp_path / "r.db") as rt2:
        assert await rt2.session_usage(result.session_id) == result.usage


def test_message_helpers() -> None:
    message = Message.user("hello")
    assert message.text == "hello" and message.char_count() == 5
