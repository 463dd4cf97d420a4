"""Nothing a tool returns or raises poisons a session, and the process still exits promptly."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import anyio
import pytest

from anabranch import Agent, Runtime, tool
from anabranch.messages import TextBlock, ToolResultBlock, ToolUseBlock
from anabranch.testing import FunctionModel, TestModel

from .helpers import call, run_until, script
from .test_cli import anabranch

pytestmark = pytest.mark.anyio

BAD_NAME = "report-\udcff.txt"  # what os.fsdecode gives for the bytes b"report-\xff.txt"


class Custom(BaseException):
    """A BaseException subclass of a tool's own."""


@tool
async def surrogate() -> str:
    """A file name that is not UTF-8, as Python decodes it."""
    return f"{BAD_NAME}\x00after NUL"


@tool
async def surrogate_json() -> dict[str, list[str]]:
    """Surrogates in keys and values of a structured result."""
    return {BAD_NAME: [BAD_NAME, "\x00"]}


@tool
async def raises_surrogate() -> str:
    """An exception whose message is not encodable."""
    raise OSError(f"cannot open {BAD_NAME}")


@tool
async def inner_cancel() -> str:
    """A cancelled inner task (what asyncio.wait_for raises) escaping the tool."""
    raise asyncio.CancelledError()


@tool
async def keyboard() -> str:
    """Raises KeyboardInterrupt itself."""
    raise KeyboardInterrupt()


@tool
async def exits() -> str:
    """Calls sys.exit."""
    sys.exit(3)


@tool
async def generator_exit() -> str:
    """Raises GeneratorExit."""
    raise GeneratorExit()


@tool
async def custom() -> str:
    """Raises a custom BaseException."""
    raise Custom("mine")


@tool
def sync_keyboard() -> str:
    """A sync tool raising KeyboardInterrupt in its thread."""
    raise KeyboardInterrupt()


RELEASE = threading.Event()


@tool(timeout=0.2)
def blocks() -> str:
    """A sync tool that blocks far past its timeout."""
    RELEASE.wait(60)
    return "late"


HOSTILE = [
    surrogate,
    surrogate_json,
    raises_surrogate,
    inner_cancel,
    keyboard,
    exits,
    generator_exit,
    custom,
    sync_keyboard,
    blocks,
]
FAILING = {
    "raises_surrogate": "OSError",
    "inner_cancel": "CancelledError",
    "keyboard": "KeyboardInterrupt",
    "exits": "SystemExit",
    "generator_exit": "GeneratorExit",
    "custom": "Custom",
    "sync_keyboard": "KeyboardInterrupt",
    "blocks": "timed out",
}


async def test_hostile_tools_finish_the_session_and_resume(tmp_path: Path) -> None:
    agent = Agent(name="hostile", instructions="Use every tool.", tools=HOSTILE)
    model = TestModel()
    RELEASE.clear()
    try:
        with anyio.fail_after(30):
            async with Runtime(db=tmp_path / "h.db", model=model) as rt:
                result = await rt.run(agent, f"list {BAD_NAME}")
                again = await rt.resume(result.session_id)
    finally:
        RELEASE.set()
    assert result.status == "done" and again.output == result.output
    results = {
        block.tool_use_id: block
        for request in model.requests
        for message in request.messages
        for block in message.content
        if isinstance(block, ToolResultBlock)
    }
    names = {
        block.id: block.name
        for request in model.requests
        for message in request.messages
        for block in message.content
        if isinstance(block, ToolUseBlock)
    }
    by_name = {names[i]: block for i, block in results.items()}
    assert set(by_name) == {t.name for t in HOSTILE}
    for name, expected in FAILING.items():
        assert by_name[name].is_error and expected in by_name[name].content, by_name[name]
    assert by_name["surrogate"].content == "report-\ufffd.txt\x00after NUL"
    assert not by_name["surrogate"].is_error
    assert "report-\ufffd.txt" in by_name["surrogate_json"].content
    assert "report-\ufffd.txt" in by_name["raises_surrogate"].content
    assert "list report-\ufffd.txt" in model.requests[0].messages[0].text


async def test_a_model_answer_with_surrogates_is_stored(tmp_path: Path) -> None:
    model = FunctionModel(script([TextBlock(text=f"found {BAD_NAME}")]))
    agent = Agent(name="plain", instructions="Answer.")
    with anyio.fail_after(20):
        async with Runtime(db=tmp_path / "m.db", model=model) as rt:
            result = await rt.run(agent, "go")
    assert result.output == "found report-\ufffd.txt"


async def test_a_cancellation_of_the_run_is_not_a_tool_failure(tmp_path: Path) -> None:
    """Cancelling the run while a tool awaits leaves the call unfinished: resume runs it."""
    entered = anyio.Event()
    calls: list[int] = []

    @tool
    async def waits() -> str:
        """Waits until cancelled the first time."""
        calls.append(1)
        if len(calls) == 1:
            entered.set()
            await anyio.sleep_forever()
        return "second time"

    model = FunctionModel(script([call("waits")], "all done"))
    agent = Agent(name="waiter", instructions="Wait.", tools=[waits])
    with anyio.fail_after(20):
        async with Runtime(db=tmp_path / "c.db", model=model) as rt:
            session_id = await run_until(rt, agent, "go", entered)
            result = await rt.resume(session_id, agent)
    assert result.status == "done" and result.output == "all done"
    assert len(calls) == 2
    results = [b for m in model.requests[-1].messages for b in m.tool_results]
    assert [(r.content, r.is_error) for r in results] == [("second time", False)]


HOSTILE_FILE = textwrap.dedent(
    '''
    import asyncio, sys, time
    from anabranch import Agent, tool

    BAD = "report-\\udcff.txt"

    class Custom(BaseException):
        pass

    @tool
    async def surrogate() -> str:
        """Non-UTF-8 name and a NUL."""
        return BAD + "\\x00"

    @tool
    async def inner_cancel() -> str:
        """CancelledError."""
        raise asyncio.CancelledError()

    @tool
    async def keyboard() -> str:
        """KeyboardInterrupt."""
        raise KeyboardInterrupt()

    @tool
    async def exits() -> str:
        """SystemExit."""
        sys.exit(2)

    @tool
    async def generator_exit() -> str:
        """GeneratorExit."""
        raise GeneratorExit()

    @tool
    async def custom() -> str:
        """Custom BaseException."""
        raise Custom("mine")

    @tool(timeout=0.5)
    def sleeps() -> str:
        """Blocks for an hour."""
        time.sleep(3600)
        return "late"

    agent = Agent(
        name="hostile",
        instructions="Use every tool.",
        tools=[surrogate, inner_cancel, keyboard, exits, generator_exit, custom, sleeps],
    )
    '''
)


def test_the_cli_finishes_a_hostile_session_and_exits_promptly(tmp_path: Path) -> None:
    """Before: a UnicodeEncodeError traceback, an internal KeyError, a BaseExceptionGroup,
    and a process that never exits (the timed-out sync tool's thread is not a daemon)."""
    source = tmp_path / "hostile.py"
    source.write_text(HOSTILE_FILE)
    db = tmp_path / "h.db"
    try:
        done = anabranch("run", f"{source}:agent", "go", "--offline", "--db", str(db), timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the process did not exit after its session finished")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    for expected in (
        "surrogate (ok): report-\ufffd.txt",
        "CancelledError",
        "KeyboardInterrupt",
        "SystemExit",
        "GeneratorExit",
        "Custom",
        "timed out after 0.5 seconds",
    ):
        assert expected in done.stdout, (expected, done.stdout)
    session_id = done.stderr.split()[1]
    resumed = anabranch("resume", session_id, "--db", str(db), "--offline", timeout=30)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == done.stdout
