"""A busy worker is not a dead one. Its heartbeat and lease renewals run on a thread and a
connection of their own, so a worker whose writes queue for longer than a lease (overloaded:
thousands of sessions on a share of the cores) keeps its sessions, while a worker whose
event loop stops turning loses them. Real parts, as in ``test_workers``: a private
PostgreSQL, worker subprocesses, the SDK over HTTP to the local Messages API server."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from anabranch import Runtime
from anabranch.runtime._loader import load_object
from anabranch.testing import MessagesServer, TestModel
from tests.databases import rows
from tests.test_workers import DEFINITIONS, held_by, midway, poll, stop_workers, workers
from tests.test_workers_scale import DB_NOW, _env

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TTL = 2.0


@contextmanager
def _held_writer_worker(
    flag: Path, defs: Path, dsn: str, env: dict[str, str]
) -> Iterator[subprocess.Popen[str]]:
    """A worker whose commits SIGUSR1 holds (``tests.held_writer_worker``)."""
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "tests.held_writer_worker", str(flag)),
            *(str(defs), "--db", dsn, "--concurrency", "3", "--executor-id", "busy"),
            *("--lease-ttl", str(TTL), "--heartbeat", "0.3"),
        ],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "serving queue anabranch" in line, line + proc.stderr.read()
        yield proc
    finally:
        flag.with_suffix(".go").touch()  # its loop turns again, if it was stopped
        stop_workers([proc])


def _finished(dsn: str, session_id: str) -> bool:
    found = rows(
        dsn,
        "SELECT status FROM session_events WHERE session_id = ? ORDER BY id DESC LIMIT 1",
        (session_id,),
    )
    return bool(found and found[0][0] in ("done", "incomplete", "failed"))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_busy_worker_keeps_its_sessions_and_a_stuck_one_loses_them(
    tmp_path: Path, postgres_dsn: str
) -> None:
    """Every commit of one worker's store is held for three lease ttls (its writer queue,
    as overload holds it), its event loop free. Its heartbeat and its leases stay fresh
    all along, so the other worker takes none of its sessions (before: both rode the held
    queue; after one ttl its leases lapsed and the other worker took them over). Then its
    event loop stops turning, the process still alive: its sessions continue on the other
    worker within half a ttl more than a killed worker's. Let go, every session finishes,
    and no finished tool ran again."""
    defs, effects = tmp_path / "defs.py", tmp_path / "effects"
    defs.write_text(textwrap.dedent(DEFINITIONS))
    flag = tmp_path / "held"
    async with MessagesServer(policy=TestModel(rounds=4), latency_ms=40) as server:
        env = _env(server, postgres_dsn, effects)
        agent = load_object(f"{defs}:researcher")
        with _held_writer_worker(flag, defs, postgres_dsn, env) as busy:
            with workers(1, [defs], postgres_dsn, env):
                async with Runtime(db=postgres_dsn) as rt:
                    ids = [
                        await rt.submit(agent, f"survey topic {i}", source=f"{defs}:researcher")
                        for i in range(6)
                    ]
                    await poll(lambda: midway(postgres_dsn, busy.pid), deadline=60)
                    busy.send_signal(signal.SIGUSR1)
                    await poll(lambda: anyio.Path(flag).exists(), deadline=10)
                    kept = held_by(postgres_dsn, busy.pid)
                    ((since,),) = rows(postgres_dsn, f"SELECT {DB_NOW}")
                    lapses: list[tuple[object, ...]] = []

                    async def three_ttls_held() -> bool:
                        # every lease it held, still its own and live; its heartbeat fresh
                        found = rows(
                            postgres_dsn,
                            f"SELECT l.session_id, l.pid, l.expires - {DB_NOW}, "
                            f"{DB_NOW} - w.heartbeat FROM leases l, workers w "
                            "WHERE w.executor_id = 'busy' AND l.session_id = ANY(?)",
                            (kept,),
                        )
                        lapses.extend(r for r in found if r[1] != busy.pid or r[2] <= 0)
                        lapses.extend(r for r in found if r[3] > TTL)
                        ((now,),) = rows(postgres_dsn, f"SELECT {DB_NOW}")
                        return bool(now > since + 3 * TTL)

                    await poll(three_ttls_held, deadline=3 * TTL + 30)
                    assert not lapses, f"the held worker lost a lease or its heartbeat: {lapses}"
                    assert flag.exists()  # held all along
                    unfinished = [s for s in kept if not _finished(postgres_dsn, s)]
                    assert unfinished, "its sessions finished while its writes were held"
                    # now its event loop stops turning (its writes still held): its
                    # heartbeat and leases lapse, and the other worker takes its sessions
                    busy.send_signal(signal.SIGHUP)

                    async def taken_over() -> bool:
                        holders = rows(
                            postgres_dsn,
                            "SELECT count(*) FROM leases WHERE pid NOT IN (?, 0) "
                            "AND expires > 0 AND session_id = ANY(?)",
                            (busy.pid, unfinished),
                        )
                        return bool(holders[0][0] == len(unfinished))

                    # half a ttl to notice the loop is stuck, a ttl for the leases to lapse,
                    # a heartbeat, DBOS's queue poll, and slack for a loaded machine
                    await poll(taken_over, deadline=TTL / 2 + TTL + 8)
                    flag.with_suffix(".go").touch()
                    busy.send_signal(signal.SIGUSR2)
                    with anyio.fail_after(120):
                        results = [await rt.wait(session_id) for session_id in ids]
    assert kept
    assert [r.status for r in results] == ["done"] * 6
    lines = effects.read_text().split("\n")[:-1]
    assert not [line for line in lines if "AGAIN" in line], "a finished tool ran again"


def test_a_heartbeat_too_slow_for_the_lease_is_one_line_before_anything_starts(
    tmp_path: Path,
) -> None:
    """Each beat renews the leases: a heartbeat over a third of the ttl is refused."""
    defs = tmp_path / "defs.py"
    defs.write_text("from anabranch import Agent\nhelper = Agent(name='helper')\n")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "anabranch", "worker", str(defs)),
            *("--db", "postgresql://nobody@127.0.0.1:1/none", "--lease-ttl", "2"),
            *("--heartbeat", "1"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "at most a third of --lease-ttl" in lines[0], done.stderr
