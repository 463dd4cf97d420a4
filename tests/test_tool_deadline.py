"""A tool's timeout: free for a tool that returns without waiting, and still enforced
(from the call's start) for one that waits, inside scopes the tool opens itself."""

from __future__ import annotations

import functools
import time
import types
from collections.abc import Generator
from pathlib import Path
from typing import Any

import anyio
import pytest

from anabranch import Agent, Runtime, Tool, tool
from anabranch.messages import ToolUseBlock
from anabranch.runtime._builtins import ToolOutcome
from anabranch.runtime._tool_exec import _Resumed, never_waits, run_user_tool
from anabranch.testing import FunctionModel

from .helpers import call, script

pytestmark = pytest.mark.anyio


async def _run(function: Tool, default: float | None = None, **arguments: Any) -> ToolOutcome:
    """``function`` called with ``arguments`` (``default``: the agent's tool timeout)."""
    use = ToolUseBlock(id="toolu_1", name=function.name, input=arguments)
    return await run_user_tool(
        function, use, session_id="s", run_id="r", agent_name="a", default_timeout=default
    )


DEADLINES: list[float] = []
"""The effective deadline each tool below saw, in order."""


@tool(timeout=5)
async def at_once(text: str) -> str:
    """Answers without waiting."""
    DEADLINES.append(anyio.current_effective_deadline())
    return f"noted: {text}"


@tool(timeout=5)
async def waits_briefly(text: str) -> str:
    """Waits one checkpoint, then answers."""
    DEADLINES.append(anyio.current_effective_deadline())
    await anyio.lowlevel.checkpoint()
    DEADLINES.append(anyio.current_effective_deadline())
    return f"later: {text}"


@tool(timeout=0.05)
async def forever() -> str:
    """Never answers."""
    await anyio.sleep_forever()
    return "unreachable"


async def test_a_tool_that_returns_at_once_arms_no_deadline() -> None:
    """No timer is set for a call that never waits: none is in effect while it runs."""
    DEADLINES.clear()
    with anyio.fail_after(30):
        test_deadline = anyio.current_effective_deadline()
        outcome = await _run(at_once, text="x")
    assert outcome == ToolOutcome("noted: x")
    assert DEADLINES == [test_deadline]  # not the tool's own, 5 s from now


async def test_a_tool_that_waits_gets_its_deadline_from_its_start() -> None:
    DEADLINES.clear()
    with anyio.fail_after(30):
        test_deadline = anyio.current_effective_deadline()
        before = anyio.current_time()
        outcome = await _run(waits_briefly, text="x")
        after = anyio.current_time()
    assert outcome == ToolOutcome("later: x")
    assert DEADLINES[0] == test_deadline  # the tool's is set once it waits
    assert before + 5 <= DEADLINES[1] <= after + 5


async def test_a_tool_that_overruns_is_cut_off() -> None:
    with anyio.fail_after(5):
        outcome = await _run(forever)
    assert outcome.is_error
    assert outcome.content == "Tool 'forever' timed out after 0.05 seconds."


async def test_the_agents_default_timeout_cuts_off_a_tool_without_one() -> None:
    @tool
    async def hangs() -> str:
        """Never answers."""
        await anyio.sleep_forever()
        return "unreachable"

    with anyio.fail_after(5):
        outcome = await _run(hangs, default=0.05)
    assert outcome.content == "Tool 'hangs' timed out after 0.05 seconds."


async def test_scopes_the_tool_opens_before_it_waits_nest_inside_the_deadline() -> None:
    """A task group and a cancel scope opened in the tool's first step (before its first
    wait) close in order, and the deadline still cuts the tool off inside them."""
    inner_exits: list[str] = []

    @tool(timeout=0.05)
    async def grouped() -> str:
        """Opens a task group and a scope, then waits forever inside them."""
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(anyio.sleep_forever)
                with anyio.CancelScope():
                    await anyio.sleep_forever()
        finally:
            inner_exits.append("closed")
        return "unreachable"

    with anyio.fail_after(5):
        outcome = await _run(grouped)
    assert outcome.content == "Tool 'grouped' timed out after 0.05 seconds."
    assert inner_exits == ["closed"]


async def test_a_tools_own_shorter_timeout_stays_its_own() -> None:
    @tool(timeout=5)
    async def own_timeout() -> str:
        """Gives up on its own after a moment."""
        with anyio.move_on_after(0.01):
            await anyio.sleep_forever()
        await anyio.lowlevel.checkpoint()
        return "gave up myself"

    with anyio.fail_after(5):
        outcome = await _run(own_timeout)
    assert outcome == ToolOutcome("gave up myself")


async def test_the_deadline_counts_from_the_calls_start() -> None:
    """A slow first step (before the tool's first wait) uses up the timeout: the deadline
    is not restarted when the tool starts waiting."""

    @tool(timeout=0.4)
    async def slow_start() -> str:
        """Works 0.3 s without waiting, then waits 0.3 s."""
        time.sleep(0.3)  # CPU-bound work before the first await, not ordering
        await anyio.sleep(0.3)
        return "in time"

    with anyio.fail_after(5):
        outcome = await _run(slow_start)
    assert outcome.content == "Tool 'slow_start' timed out after 0.4 seconds."


async def test_failures_before_and_after_the_first_wait_are_the_tools() -> None:
    @tool(timeout=5)
    async def fails_at_once() -> str:
        """Raises before waiting."""
        raise ValueError("at once")

    @tool(timeout=5)
    async def fails_later() -> str:
        """Raises after waiting."""
        await anyio.lowlevel.checkpoint()
        raise ValueError("later")

    with anyio.fail_after(5):
        first = await _run(fails_at_once)
        second = await _run(fails_later)
    assert first == ToolOutcome("Tool 'fails_at_once' failed: ValueError: at once", True)
    assert second == ToolOutcome("Tool 'fails_later' failed: ValueError: later", True)


async def test_cancelling_the_caller_while_the_tool_waits_propagates() -> None:
    """A cancellation of the run is no tool outcome, before or after the deadline is set."""
    entered = anyio.Event()
    seen: list[str] = []

    @tool(timeout=30)
    async def blocks() -> str:
        """Waits until cancelled."""
        entered.set()
        await anyio.sleep_forever()
        return "unreachable"

    async def caller() -> None:
        try:
            outcome = await _run(blocks)
        except anyio.get_cancelled_exc_class():
            seen.append("cancelled")
            raise
        seen.append(f"outcome {outcome.content}")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(caller)
            await entered.wait()
            group.cancel_scope.cancel()
    assert seen == ["cancelled"]


async def test_a_tool_catching_the_cancellation_still_reports_the_timeout() -> None:
    """A tool that swallows the deadline's cancellation and waits again is cancelled again
    (the scope stays cancelled) and reported as timed out."""
    caught: list[int] = []

    @tool(timeout=0.05)
    async def stubborn() -> str:
        """Catches the first cancellation, then waits again."""
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            caught.append(1)
        await anyio.sleep_forever()
        return "unreachable"

    with anyio.fail_after(5):
        outcome = await _run(stubborn)
    assert caught == [1]
    assert outcome.content == "Tool 'stubborn' timed out after 0.05 seconds."


async def test_a_run_cuts_off_an_overrunning_tool_and_keeps_a_quick_ones_result(
    tmp_path: Path,
) -> None:
    """Through the runtime (one call per turn, then two in parallel): the agent's
    ``tool_timeout`` cuts off the tool that waits forever; the others' results stand."""

    @tool
    async def quick(text: str) -> str:
        """Answers at once."""
        return f"quick {text}"

    @tool
    async def stuck() -> str:
        """Never answers."""
        await anyio.sleep_forever()
        return "unreachable"

    turns = [[call("quick", text="a")], [call("stuck")], [call("quick", text="b"), call("stuck")]]
    model = FunctionModel(script(*turns, "done"))
    agent = Agent(name="a", instructions="Go.", tools=[quick, stuck], tool_timeout=0.05)
    with anyio.fail_after(20):
        async with Runtime(db=tmp_path / "t.db", model=model) as rt:
            result = await rt.run(agent, "go")
    assert result.status == "done" and result.output == "done"
    results = [b for m in model.requests[-1].messages for b in m.tool_results]
    timed_out = "Tool 'stuck' timed out after 0.05 seconds."
    assert [(r.content, r.is_error) for r in results] == [
        ("quick a", False),
        (timed_out, True),
        ("quick b", False),
        (timed_out, True),
    ]


@types.coroutine
def _suspend(label: str) -> Generator[str, Any, Any]:
    """Yields ``label`` to whoever drives the coroutine, returns what it is sent."""
    return (yield label)


def test_a_resumed_await_hands_over_what_the_loop_sends_and_throws() -> None:
    """``_Resumed`` passes on every yield, send, throw and close as ``await`` does."""
    seen: list[Any] = []

    async def body() -> str:
        seen.append(await _suspend("first"))
        try:
            await _suspend("second")
        except KeyError as exc:
            seen.append(f"caught {exc}")
        try:
            await _suspend("third")
        finally:
            seen.append("closed")
        return "unreachable"

    inner = body()
    step = inner.send(None)

    async def outer() -> Any:
        return await _Resumed(inner, step)

    driver = outer()
    assert driver.send(None) == "first"
    assert driver.send("sent") == "second"
    assert driver.throw(KeyError("k")) == "third"
    driver.close()
    assert seen == ["sent", "caught 'k'", "closed"]


def test_a_resumed_await_returns_the_coroutines_value() -> None:
    async def body() -> str:
        return f"got {await _suspend('wait')}"

    inner = body()
    step = inner.send(None)

    async def outer() -> Any:
        return await _Resumed(inner, step)

    driver = outer()
    assert driver.send(None) == "wait"
    with pytest.raises(StopIteration) as done:
        driver.send("it")
    assert done.value.value == "got it"


async def _plain(x: str) -> str:
    return x


async def _waits_in_a_branch(x: str) -> str:
    """Waits only when asked to."""
    if x == "wait":
        await anyio.lowlevel.checkpoint()
    return x


async def _async_with(x: str) -> str:
    async with anyio.Lock():
        return x


async def _async_for(x: Any) -> None:
    async for _ in x:
        pass


async def _async_comprehension(x: Any) -> list[Any]:
    return [await y for y in x]


async def _defines_a_waiting_one(x: str) -> Any:
    async def inner() -> None:
        await anyio.lowlevel.checkpoint()

    return inner


def test_only_an_async_def_without_a_suspension_never_waits() -> None:
    """``never_waits`` is True only when the coroutine cannot suspend: its own code has no
    ``await``, ``async for``, ``async with`` (an awaiting function it merely defines does
    not run); anything it cannot be sure of is False."""
    assert never_waits(_plain) and never_waits(_defines_a_waiting_one)
    for function in (_waits_in_a_branch, _async_with, _async_for, _async_comprehension):
        assert not never_waits(function), function.__name__
    assert not never_waits(lambda: _plain("x"))  # returns a coroutine, is not one
    assert not never_waits(functools.partial(_plain, "x"))
    assert not never_waits(str)
    assert never_waits(at_once.function) and not never_waits(waits_briefly.function)


async def test_a_tool_that_cannot_wait_enters_no_scope_and_one_that_may_does() -> None:
    """The deadline's scope is made only for a tool that may wait: a call of one that cannot
    (``at_once``) enters none, while one that waits only sometimes always gets it."""
    made: list[anyio.CancelScope] = []

    def scope() -> anyio.CancelScope:
        made.append(anyio.CancelScope())
        return made[-1]

    branchy = tool(timeout=5)(_waits_in_a_branch)
    with anyio.fail_after(30):
        for function, arguments, scopes in (
            (at_once, {"text": "x"}, 0),
            (branchy, {"x": "no"}, 1),
            (branchy, {"x": "wait"}, 2),
        ):
            use = ToolUseBlock(id="toolu_1", name=function.name, input=arguments)
            outcome = await run_user_tool(
                function,
                use,
                session_id="s",
                run_id="r",
                agent_name="a",
                default_timeout=None,
                cancel_scope=scope,
            )
            assert not outcome.is_error, outcome
            assert len(made) == scopes, function.name
