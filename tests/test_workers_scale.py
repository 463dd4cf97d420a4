"""Workers beyond agent sessions: graphs on the queue, failover of a stalled worker by its
sessions' expired leases (a real SIGSTOP), and one model-call rate limit shared by every
worker. Same real parts as ``test_workers``: a private PostgreSQL, worker subprocesses,
the official SDK over HTTP to the local Messages API server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from anabranch import GraphResult, Runtime
from anabranch.runtime._loader import load_object
from anabranch.testing import MessagesServer, TestModel
from tests.databases import rows, table_counts
from tests.test_workers import DEFINITIONS, held_by, midway, poll, workers

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

DB_NOW = "extract(epoch from clock_timestamp())::float8"

GRAPH = """
from anabranch import Graph, Task

survey = Graph(
    name="survey",
    tasks=(
        Task(id="gather", agent=researcher, prompt="Gather the sources"),
        Task(id="check", agent=researcher, prompt="Check the sources"),
        Task(id="write", agent=researcher, prompt="Write it up", depends_on=("gather", "check")),
    ),
)
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _env(server: MessagesServer, dsn: str, effects: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "ANTHROPIC_BASE_URL": server.base_url,
        "ANTHROPIC_API_KEY": "test-key",
        "TEST_DSN": dsn,
        "TEST_EFFECTS": str(effects),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    os.environ["TEST_DSN"], os.environ["TEST_EFFECTS"] = dsn, str(effects)
    return env


def _defs(tmp_path: Path) -> Path:
    defs = tmp_path / "defs.py"
    defs.write_text(textwrap.dedent(DEFINITIONS) + textwrap.dedent(GRAPH))
    return defs


def _stopped(pid: int) -> bool:
    """The kernel has stopped ``pid`` (state ``T``)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def _local_ports(pid: int) -> list[int]:
    """The local TCP ports of ``pid``'s sockets (its database connections among them)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    ports = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


LOCKS_LEASE_ROWS = (
    "SELECT count(*) FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
    "JOIN pg_class c ON c.oid = l.relation WHERE a.datname = current_database() "
    "AND a.state = 'idle in transaction' AND c.relname = 'leases' AND l.granted "
    "AND a.client_port = ANY(%s)"
)
"""Whether one of the given client ports' database sessions is inside a transaction,
waiting for its client, with lease rows locked (a batch's lease check, a renewal or a
takeover under way)."""


def _locks_lease_rows(dsn: str, pid: int) -> bool:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        return _locked(conn, pid)


def _locked(conn: Any, pid: int) -> bool:
    row = conn.execute(LOCKS_LEASE_ROWS, (_local_ports(pid),)).fetchone()
    return bool(row[0])


async def _open_lock_gone(dsn: str, pid: int) -> bool:
    return not await anyio.to_thread.run_sync(_locks_lease_rows, dsn, pid)


def _catch_inside_a_lease_lock(dsn: str, pid: int, deadline: float) -> bool:
    """SIGSTOP ``pid``, preferably caught with one of its transactions holding lease rows
    locked: stopped, looked at, let go if it is not, and let run again at least as long as
    that took (so its sessions keep most of their pace) before the next try. At the
    deadline it is stopped wherever it is (False): on a quiet machine a worker spends too
    little of its time inside such a transaction to be caught there reliably, and its
    sessions must still be part-way through when it stops."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            tried = time.monotonic()
            os.kill(pid, signal.SIGSTOP)
            while not _stopped(pid):
                time.sleep(0.001)
            if _locked(conn, pid):
                return True
            if tried >= deadline:
                return False
            os.kill(pid, signal.SIGCONT)
            time.sleep(max(0.02, time.monotonic() - tried))  # the tries' pace, no ordering


async def _stop_inside_a_lease_lock(dsn: str, proc: subprocess.Popen[str]) -> bool:
    """SIGSTOP ``proc``, if it can be caught there within a second, while one of its
    transactions holds lease rows locked: the worst point for a takeover, as a worker
    frozen there keeps those locks (True when it was caught there)."""
    deadline = time.monotonic() + 1.0
    return await anyio.to_thread.run_sync(_catch_inside_a_lease_lock, dsn, proc.pid, deadline)


async def _stop_a_worker_midway(
    dsn: str, procs: list[subprocess.Popen[str]], ttl: float
) -> tuple[int, list[str], float, float]:
    """SIGSTOP a worker found part-way through a session (preferably inside a lease lock)
    and wait until its open transaction has ended. Returns its index, the unfinished
    sessions it held when it stopped, and when it stopped (``anyio.current_time()``,
    ``time.time()``). On return (or on an error) the worker is stopped; the caller sends it
    SIGCONT.

    Its sessions are read while it is stopped: once its open transaction ends, another
    worker may take them over at once (the server ends that transaction only after the
    leases in it have expired), and then they are no longer its. One it finished may have
    been caught with its lease unreleased: those whose latest status is not ``running``
    once that transaction has ended are left out."""
    index = await _midway_worker(dsn, procs)
    victim = procs[index]
    await _stop_inside_a_lease_lock(dsn, victim)
    stopped, stopped_at = anyio.current_time(), time.time()
    held = held_by(dsn, victim.pid)
    # its open transaction ends (the server ends it after a ttl, or the COMMIT it had
    # sent lands)
    await poll(partial(_open_lock_gone, dsn, victim.pid), deadline=ttl + 8)
    taken = _unfinished(dsn, held)
    assert taken, f"the worker stopped mid-way held no unfinished session: {held}"
    return index, taken, stopped, stopped_at


def _unfinished(dsn: str, sessions: list[str]) -> list[str]:
    """Those of ``sessions`` whose latest status is ``running``."""
    found = rows(
        dsn,
        "SELECT DISTINCT ON (session_id) session_id, status FROM session_events "
        "WHERE session_id = ANY(?) ORDER BY session_id, id DESC",
        (sessions,),
    )
    return [str(r[0]) for r in found if r[1] == "running"]


def _started_unfinished(dsn: str, sessions: list[str], before: float) -> frozenset[str]:
    """Calls of ``sessions`` whose ``started`` event was made before ``before`` (this host's
    clock) and no ``finished`` one: those a process stopped then may have been inside.
    Read by when each event was made, not by what was committed at the stop: the stopped
    process's last COMMIT may still reach the server just after it."""
    found = rows(
        dsn,
        "SELECT t.call_id FROM tool_events t JOIN runs r ON r.id = t.run_id WHERE "
        "r.session_id = ANY(?) GROUP BY t.call_id HAVING "
        "bool_or(t.event = 'started' AND t.created < ?) "
        "AND NOT bool_or(t.event = 'finished' AND t.created < ?)",
        (sessions, before, before),
    )
    return frozenset(str(r[0]) for r in found)


async def _midway_worker(dsn: str, procs: list[subprocess.Popen[str]]) -> int:
    """The index of a worker that holds a live lease on a session part-way through."""
    found: list[int] = []

    async def any_midway() -> bool:
        for index, proc in enumerate(procs):
            if await midway(dsn, proc.pid):
                found.append(index)
                return True
        return False

    await poll(any_midway, deadline=60)
    return found[0]


def _check_taken_over(
    dsn: str,
    effects: Path,
    server: MessagesServer,
    taken: list[str],
    victim: int,
    in_flight: frozenset[str] = frozenset(),
) -> None:
    """No finished tool ran again, the server accepted every request, and another
    process holds each session the victim had.

    ``in_flight``: tool calls the victim had started (ledger ``started``, no ``finished``)
    when it was stopped. A stopped process resumes the function it was in: such a call may
    still run in it after another worker finished it. Nothing else may."""
    lines = effects.read_text().split("\n")[:-1] if effects.exists() else []
    again = [line.split() for line in lines if "AGAIN" in line]
    unexplained = [a for a in again if not (int(a[3]) == victim and a[1] in in_flight)]
    assert not unexplained, f"a finished tool ran again: {unexplained}"
    assert not [(r.status, r.error_message) for r in server.log if r.status != 200]
    for session_id in taken:
        holder = rows(dsn, "SELECT pid FROM leases WHERE session_id = ?", (session_id,))
        assert holder[0][0] != victim


async def test_graph_sessions_are_queued_and_survive_a_killed_worker(
    tmp_path: Path, postgres_dsn: str
) -> None:
    """Graphs go on the queue like agents (``rt.submit(graph)``, ``anabranch submit
    FILE:GRAPH``); a worker killed with kill -9 mid-graph has its graph finished by the
    other one, with every task's report, no pairing error and no finished tool run again."""
    defs, effects = _defs(tmp_path), tmp_path / "effects"
    async with MessagesServer(policy=TestModel(rounds=4), latency_ms=40) as server:
        env = _env(server, postgres_dsn, effects)
        graph = load_object(f"{defs}:survey")
        with workers(2, [defs], postgres_dsn, env) as procs:
            async with Runtime(db=postgres_dsn) as rt:
                ids = [await rt.submit(graph, source=f"{defs}:survey") for _ in range(3)]
                victim = procs[await _midway_worker(postgres_dsn, procs)]
                victim.kill()
                victim.wait(timeout=10)
                taken = held_by(postgres_dsn, victim.pid)
                assert taken, "the killed worker held no graph session"
                with anyio.fail_after(120):
                    results = [await rt.wait(session_id) for session_id in ids]
                    cli = [sys.executable, "-m", "anabranch"]
                    submitted = await anyio.run_process(
                        [*cli, "submit", f"{defs}:survey", "--db", postgres_dsn], env=env
                    )
                    waited = await anyio.run_process(
                        [
                            *cli,
                            "wait",
                            submitted.stdout.decode().strip(),
                            "--db",
                            postgres_dsn,
                            "--timeout",
                            "60",
                        ],
                        env=env,
                    )
                refused = await anyio.run_process(
                    [*cli, "submit", f"{defs}:survey", "a task", "--db", postgres_dsn],
                    env=env,
                    check=False,
                )
    assert refused.returncode != 0 and b"drop TASK" in refused.stderr
    assert waited.stdout.decode().startswith("Report on: Write it up")
    for result in results:
        assert isinstance(result, GraphResult) and result.status == "done"
        assert {t.id: t.status for t in result.tasks.values()} == dict.fromkeys(
            ("gather", "check", "write"), "done"
        )
        assert result.output.startswith("Report on: Write it up")
    _check_taken_over(postgres_dsn, effects, server, taken, victim.pid)


async def test_a_stopped_worker_loses_its_sessions_by_lease_and_is_fenced(
    tmp_path: Path, postgres_dsn: str
) -> None:
    """SIGSTOP a worker mid-way (its event loop cannot run: no lease renewal). Heartbeat
    expiry is off (``--dead-after 600``), so only the expired leases can trigger failover:
    its sessions continue on the others within the lease ttl plus a few seconds and finish.
    SIGCONT it: it is fenced, and writes nothing more to the store. (A tool function it was
    already inside when stopped runs on when it continues: no store can recall that.)"""
    defs, effects = _defs(tmp_path), tmp_path / "effects"
    ttl = 2.0
    # eight rounds of 120 ms calls: a session found mid-way outlasts the second it may take
    # to catch its worker by a wide margin
    async with MessagesServer(policy=TestModel(rounds=8), latency_ms=120) as server:
        env = _env(server, postgres_dsn, effects)
        agent = load_object(f"{defs}:researcher")
        with workers(3, [defs], postgres_dsn, env, "--dead-after", "600") as procs:
            async with Runtime(db=postgres_dsn) as rt:
                ids = [
                    await rt.submit(agent, f"survey topic {i}", source=f"{defs}:researcher")
                    for i in range(6)
                ]
                # the victim is a worker found mid-way: which workers DBOS hands the
                # sessions to is its business (on a quiet machine one may get none)
                index, taken, stopped, stopped_at = await _stop_a_worker_midway(
                    postgres_dsn, procs, ttl
                )
                victim, executor = procs[index], f"w{index + 1}"
                try:

                    async def taken_over() -> bool:
                        holders = rows(
                            postgres_dsn,
                            "SELECT count(*) FROM leases WHERE pid <> ? AND expires > 0 "
                            f"AND session_id IN ({', '.join('?' * len(taken))})",
                            (victim.pid, *taken),
                        )
                        return bool(holders[0][0] == len(taken))

                    # the bound: lease ttl, a heartbeat, DBOS's queue poll, and slack for
                    # a loaded machine
                    await poll(taken_over, deadline=ttl + 8 - (anyio.current_time() - stopped))
                    with anyio.fail_after(120):
                        results = [await rt.wait(session_id) for session_id in ids]
                    before = table_counts(postgres_dsn)
                    (since,) = rows(postgres_dsn, f"SELECT {DB_NOW}")[0]
                finally:
                    victim.send_signal(signal.SIGCONT)

                async def victim_ran_a_while() -> bool:
                    # its event loop is back: three heartbeats after SIGCONT
                    beat = rows(
                        postgres_dsn,
                        "SELECT heartbeat FROM workers WHERE executor_id = ?",
                        (executor,),
                    )
                    return bool(beat[0][0] > since + 1.0)

                await poll(victim_ran_a_while, deadline=30)
                after = table_counts(postgres_dsn)
    assert [r.status for r in results] == ["done"] * 6
    assert all(r.output.startswith("Report on: survey topic") for r in results)
    assert after == before, "the stalled worker wrote after it came back"
    in_flight = _started_unfinished(postgres_dsn, ids, stopped_at)
    _check_taken_over(postgres_dsn, effects, server, taken, victim.pid, in_flight)


def _busiest(times: list[float], period: float) -> int:
    ordered = sorted(times)
    return max((sum(1 for t in ordered if s <= t < s + period) for s in ordered), default=0)


async def test_workers_share_one_model_call_rate_and_honour_retry_after(
    tmp_path: Path, postgres_dsn: str
) -> None:
    """Three workers under ``--rpm 6 --rate-period 3``: at the server, no window of 3 s
    ever holds more than 6 calls (though six sessions at once would make many more), a 429
    with retry-after pauses every worker, and no call is lost: every session finishes and
    every call the store recorded reached the server.

    A call reaches the server a moment after the database granted it; on a loaded machine
    that moment varies, so the windows checked are 0.5 s shorter than the limit's."""
    defs, effects = _defs(tmp_path), tmp_path / "effects"
    period, limit, retry_after, slack = 3.0, 6, 3.0, 0.5
    async with MessagesServer(policy=TestModel(rounds=2), latency_ms=40) as server:
        env = _env(server, postgres_dsn, effects)
        agent = load_object(f"{defs}:researcher")
        server.inject("rate_limit", retry_after=retry_after)  # the first call is refused
        rate = ("--rpm", str(limit), "--rate-period", str(period))
        with workers(3, [defs], postgres_dsn, env, *rate):
            async with Runtime(db=postgres_dsn) as rt:
                ids = [
                    await rt.submit(agent, f"survey topic {i}", source=f"{defs}:researcher")
                    for i in range(6)
                ]
                with anyio.fail_after(120):
                    results = [await rt.wait(session_id) for session_id in ids]
    assert [r.status for r in results] == ["done"] * 6
    calls = [r for r in server.log if r.endpoint == "messages"]
    refused = [r for r in calls if r.status == 429]
    assert len(refused) == 1 and all(r.status in (200, 429) for r in calls)
    times = [r.timestamp for r in calls]
    seen = [(round(r.timestamp - times[0], 2), r.status) for r in calls]
    assert _busiest(times, period - slack) <= limit, seen
    assert _busiest(times, period + slack) >= limit  # the limit held them back
    # the pause as the database recorded it (the refused worker wrote it a moment after
    # the 429): from then until it ends, no worker calls (grants made just before it may
    # still be arriving: allow for those)
    ((until,),) = rows(postgres_dsn, "SELECT blocked_until FROM call_limits")
    recorded = until - retry_after
    assert recorded >= refused[0].timestamp - slack
    during = [r for r in calls if recorded + slack < r.timestamp < until]
    assert not during, f"a worker called the model during the retry-after pause: {seen}"
    stored = rows(postgres_dsn, "SELECT count(*) FROM calls")[0][0]
    assert stored == len(calls), (stored, len(calls))
