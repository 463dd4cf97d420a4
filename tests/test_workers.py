"""Sessions dispatched by DBOS to ``anabranch worker`` processes on one PostgreSQL.

Real parts throughout: a private PostgreSQL cluster, worker subprocesses started as users
start them, the official SDK in each worker talking HTTP to the local Messages API server
(which rejects any request whose tool_use/tool_result pairing is broken), and ``kill -9``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import anyio
import pytest

from anabranch import Runtime
from anabranch.runtime._loader import load_object
from anabranch.testing import MessagesServer, TestModel
from tests.databases import rows
from tests.test_postgres import password

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

DEFINITIONS = '''
"""Agents the worker tests serve: a tool with a side effect per call id that checks, before
doing anything, whether the store already has its result (a finished tool run again)."""

import os
import time

import psycopg

from anabranch import Agent, ToolContext, tool

DSN = os.environ["TEST_DSN"]
EFFECTS = os.environ["TEST_EFFECTS"]


@tool
def fetch(source: str, ctx: ToolContext) -> str:
    """Fetch one source."""
    with psycopg.connect(DSN) as conn:
        again = conn.execute(
            "SELECT count(*) FROM anabranch.tool_events WHERE run_id = %s AND call_id = %s "
            "AND event = 'finished'",
            (ctx.run_id, ctx.call_id),
        ).fetchone()[0]
    with open(EFFECTS, "a") as out:
        out.write(f"{ctx.run_id} {ctx.call_id} {'AGAIN' if again else 'first'} {os.getpid()}\\n")
    time.sleep(0.15)
    return f"{source}: the contents of {source} " + "text " * 40


researcher = Agent(name="researcher", instructions="Fetch, then report.", tools=[fetch])
'''


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the test process; workers are subprocesses (asyncio by DBOS)


@contextmanager
def workers(
    count: int, files: list[Path], dsn: str, env: dict[str, str], *extra: str
) -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    try:
        for i in range(count):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "anabranch",
                        "worker",
                        *map(str, files),
                        "--db",
                        dsn,
                        "--concurrency",
                        "3",
                        "--executor-id",
                        f"w{i + 1}",
                        "--lease-ttl",
                        "2",
                        "--heartbeat",
                        "0.3",
                        *extra,
                    ],
                    env=env,
                    stderr=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    text=True,
                )
            )
        for proc in procs:  # each announces itself once it dequeues
            assert proc.stderr is not None
            line = proc.stderr.readline()
            assert "serving queue anabranch" in line, line + proc.stderr.read()
        yield procs
    finally:
        stop_workers(procs)


def stop_workers(procs: list[subprocess.Popen[str]]) -> None:
    """SIGTERM each worker still running, then wait for each (SIGKILL after 30 s)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()


@asynccontextmanager
async def setup(tmp_path: Path, dsn: str) -> AsyncIterator[tuple[MessagesServer, dict[str, str]]]:
    async with MessagesServer(policy=TestModel(rounds=3), latency_ms=40) as server:
        env = {
            **os.environ,
            "ANTHROPIC_BASE_URL": server.base_url,
            "ANTHROPIC_API_KEY": "test-key",
            "TEST_DSN": dsn,
            "TEST_EFFECTS": str(tmp_path / "effects"),
            "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        }
        yield server, env


async def poll(condition: Callable[[], Awaitable[bool]], *, deadline: float) -> None:
    """Wait until ``condition()`` holds (checked every 50 ms), at most ``deadline`` s."""
    with anyio.fail_after(deadline):
        while True:
            if await condition():
                return
            await anyio.sleep(0.05)


async def midway(dsn: str, pid: int) -> bool:
    """``pid`` holds a live lease on a session in which some tool has finished."""
    found = await anyio.to_thread.run_sync(
        rows,
        dsn,
        "SELECT count(*) FROM leases l WHERE l.pid = ? AND l.expires > "
        "extract(epoch from clock_timestamp()) AND EXISTS (SELECT 1 FROM tool_events t "
        "JOIN runs r ON r.id = t.run_id WHERE r.session_id = l.session_id "
        "AND t.event = 'finished')",
        (pid,),
    )
    return bool(found[0][0])


def held_by(dsn: str, pid: int) -> list[str]:
    """The sessions ``pid`` holds (or held, unreleased) leases on."""
    found = rows(dsn, "SELECT session_id FROM leases WHERE pid = ? AND expires > 0", (pid,))
    return [str(r[0]) for r in found]


async def test_twelve_sessions_three_workers_one_killed(tmp_path: Path, postgres_dsn: str) -> None:
    """The issue's 'done when': 12 sessions from one process to 3 workers; one worker is
    killed with kill -9 mid-way; every session finishes with its report, no request was
    rejected (pairing), and no finished tool ran again."""
    defs = tmp_path / "defs.py"
    defs.write_text(textwrap.dedent(DEFINITIONS))
    effects = tmp_path / "effects"
    async with setup(tmp_path, postgres_dsn) as (server, env):
        os.environ["TEST_DSN"], os.environ["TEST_EFFECTS"] = postgres_dsn, str(effects)
        agent = load_object(f"{defs}:researcher")
        with workers(3, [defs], postgres_dsn, env) as procs:
            victim = procs[0]
            async with Runtime(db=postgres_dsn) as rt:
                ids = [
                    await rt.submit(agent, f"survey topic {i}", source=f"{defs}:researcher")
                    for i in range(12)
                ]

                await poll(lambda: midway(postgres_dsn, victim.pid), deadline=60)
                victim.kill()  # kill -9
                victim.wait(timeout=10)
                taken = held_by(postgres_dsn, victim.pid)
                assert taken, "the killed worker held no session"
                results = []
                with anyio.fail_after(120):
                    for session_id in ids:
                        results.append(await rt.wait(session_id))
                    # the same from the command line: submit returns the id at once
                    cli = [sys.executable, "-m", "anabranch"]
                    submitted = await anyio.run_process(
                        [*cli, "submit", f"{defs}:researcher", "one more", "--db", postgres_dsn],
                        env=env,
                    )
                    new_id = submitted.stdout.decode().strip()
                    waited = await anyio.run_process(
                        [*cli, "wait", new_id, "--db", postgres_dsn, "--timeout", "60"], env=env
                    )
    assert waited.stdout.decode().startswith("Report on: one more")
    assert password(postgres_dsn) not in (submitted.stderr + waited.stderr).decode()
    assert [r.status for r in results] == ["done"] * 12
    assert all(r.output.startswith("Report on: survey topic") for r in results)
    lines = effects.read_text().split("\n")[:-1]
    assert not [line for line in lines if "AGAIN" in line], "a finished tool ran again"
    bad = [r for r in server.log if r.status != 200]
    assert not bad, [(r.status, r.error_message) for r in bad]
    # the killed worker's sessions were finished by the others
    finished_by = {line.split()[3] for line in lines}
    assert len(finished_by) == 3
    for session_id in taken:
        holders = rows(postgres_dsn, "SELECT pid FROM leases WHERE session_id = ?", (session_id,))
        assert holders[0][0] != victim.pid
