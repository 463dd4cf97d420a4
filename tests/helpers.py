"""Small builders shared by tests."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio

from anabranch.errors import RunFailedError
from anabranch.messages import Block, ModelRequest, TextBlock, ToolUseBlock
from anabranch.runtime import RunResult
from anabranch.store import SQLiteStore, Store

if TYPE_CHECKING:
    from anabranch import Agent, Runtime

_ids = itertools.count(1)


class _HasAttributes(Protocol):
    @property
    def attributes(self) -> Mapping[str, Any] | None: ...


def installed_tool(name: str) -> str:
    """The path of a command installed in this interpreter's environment (the dev extras)."""
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    assert found is not None, f"{name} is not installed (pip install -e '.[dev]')"
    return found


def attributes(item: _HasAttributes) -> dict[str, Any]:
    """A span's (or span event's) attributes as a plain dict: {} when it has none.

    OpenTelemetry types the values as a union of every attribute type; a test knows which
    one it set, and compares it as such.
    """
    return dict(item.attributes or {})


def call(tool_name: str, /, **arguments: Any) -> ToolUseBlock:
    """A tool_use block with a fresh id."""
    return ToolUseBlock(id=f"toolu_{next(_ids):04d}", name=tool_name, input=arguments)


def script(*turns: Sequence[Block] | str) -> Callable[[ModelRequest], list[Block]]:
    """A FunctionModel function answering successive calls with the given turns."""
    remaining = list(turns)

    def respond(request: ModelRequest) -> list[Block]:
        if not remaining:
            raise AssertionError("the model was called more often than scripted")
        turn = remaining.pop(0)
        return [TextBlock(text=turn)] if isinstance(turn, str) else list(turn)

    return respond


E = TypeVar("E", bound=BaseException)


def failed_with(result: RunResult, kind: type[E], match: str | None = None) -> E:
    """Assert that a session ended ``failed`` because of a ``kind`` error (raised in this
    process): ``raise_for_status()`` raises ``RunFailedError`` chained to it. The error."""
    assert result.status == "failed", f"the session ended {result.status}: {result.output!r}"
    try:
        result.raise_for_status()
    except RunFailedError as failure:
        cause = failure.__cause__
        assert failure.result is result and failure.session_id == result.session_id
        assert isinstance(cause, kind), f"failed with {cause!r}, not a {kind.__name__}"
        assert result.error and str(cause) in result.error
        if match is not None:
            assert re.search(match, str(cause)), f"{cause} does not match {match!r}"
        return cause
    raise AssertionError("raise_for_status() did not raise for a failed session")


async def wait_until(
    check: Callable[[], Awaitable[bool]], *, within: float = 30.0, interval: float = 0.005
) -> None:
    """Poll ``check()`` until it is true, for at most ``within`` seconds (the store has no
    change notifications to wait on); fails the test at the deadline."""
    with anyio.fail_after(within):
        while not await check():  # noqa: ASYNC110 - polling another connection's commits
            await anyio.sleep(interval)


async def sql(store: Store, query: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Read-only SQL on the store behind a runtime (these tests use the SQLite backend)."""
    assert isinstance(store, SQLiteStore), f"SQL checks need the SQLite store, not {store!r}"
    return await store.query(query, params)


def kill_9_once_marked(process: subprocess.Popen[str], marker: Path, what: str) -> None:
    """Wait (90 s at most) until ``process`` writes ``marker``, then ``kill -9`` it."""
    try:
        deadline = time.monotonic() + 90
        while not marker.exists():
            assert time.monotonic() < deadline, f"the process never reached {what}"
            assert process.poll() is None, process.communicate()
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGKILL


async def run_until(rt: Runtime, agent: Agent, task: str, reached: anyio.Event) -> str:
    """Start ``agent`` on ``task``, cancel the run once ``reached`` is set (as a Ctrl-C
    would), and return the session id, left interrupted."""
    sessions: list[str] = []
    async with anyio.create_task_group() as group:

        async def run() -> None:
            await rt.run(agent, task, on_session=sessions.append)

        group.start_soon(run)
        await reached.wait()
        group.cancel_scope.cancel()
    return sessions[0]


async def traced_store(db: Path) -> tuple[SQLiteStore, list[list[str]]]:
    """A real SQLite store whose committed transactions are logged, each as the list of
    its statements (a rolled-back one is forgotten)."""
    store = await SQLiteStore.open(db)
    transactions: list[list[str]] = [[]]

    def trace(statement: str) -> None:
        if statement.strip().upper().startswith("COMMIT"):
            transactions.append([])
        elif statement.strip().upper().startswith("ROLLBACK"):
            transactions[-1] = []
        else:
            transactions[-1].append(statement)

    store._sql._conn.set_trace_callback(trace)
    return store, transactions
