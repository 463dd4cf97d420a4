"""The crash test on PostgreSQL with three worker processes: SIGKILL workers at the
protocol points while they run the crash scenario, and let the survivors finish it.

One session (the supervisor scenario, children at depths 1 and 2, compaction) is submitted
to a DBOS queue served by three crash-test workers (``tests.crash.worker``), each armed
with its own kill point from a seeded stream (commit, request, mid-stream, response,
mid-compaction, inside a tool before and after its side effect, or a timer). Whenever one
is killed, the others take its session over (heartbeat failover) and a fresh worker with
the next kill point replaces it, so three workers serve the queue all along. The finished
session must equal an uninterrupted run's exactly (``harness.check_chain``): no finished
tool run again, every side effect once, every request identical on resend, no pairing
error.
"""

from __future__ import annotations

import random
import signal
from collections import Counter
from multiprocessing.process import BaseProcess
from pathlib import Path

import anyio
import pytest

from anabranch import Runtime
from anabranch.store import PostgresStore
from anabranch.testing import MessagesServer
from tests.crash.driver import IN_PROCESS_EVENTS
from tests.crash.harness import (
    Chain,
    KillPoint,
    KillSwitch,
    check_chain,
    fork_context,
    random_kill_points,
    request_keys,
    transcript,
)
from tests.crash.scenario import ROOT, TASK, ScenarioModel
from tests.crash.worker import WorkerSpec, worker_main
from tests.postgres_cluster import Cluster, create_database

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

WORKERS = 3
MIN_KILLS = 8
MAX_KILLS = 16
"""After this many kills, replacements are started without a kill point."""
SEED = 17
DEADLINE = 300.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # workers run on asyncio (DBOS); the test process with them


class Pool:
    """Three workers on one queue; a killed one is replaced by a fresh one."""

    def __init__(self, workdir: Path, dsn: str, base_url: str) -> None:
        self.workdir, self.dsn, self.base_url = workdir, dsn, base_url
        self.procs: dict[str, BaseProcess] = {}
        self.started = 0
        self.timers: list[tuple[BaseProcess, float]] = []
        """Workers to kill after so many seconds (``timer`` kill points)."""

    def start(self, kill: KillPoint | None) -> None:
        self.started += 1
        spec = WorkerSpec(
            dsn=self.dsn,
            workdir=str(self.workdir),
            base_url=self.base_url,
            executor_id=f"crash-{self.started}",
            kill_event=kill.event if kill and kill.event in IN_PROCESS_EVENTS else None,
            kill_at=kill.at if kill else 0,
        )
        proc = fork_context().Process(target=worker_main, args=(spec.to_json(),))
        proc.start()
        self.procs[spec.executor_id] = proc
        if kill is not None and kill.event == "timer":
            self.timers.append((proc, kill.at / 1000.0))

    async def ready(self) -> None:
        with anyio.fail_after(120):
            while True:
                if all((self.workdir / f"{e}.ready").exists() for e in self.procs):
                    return
                await anyio.sleep(0.05)

    def killed(self) -> list[str]:
        """Executors that died since the last look (by SIGKILL only: anything else fails)."""
        dead = []
        for executor, proc in list(self.procs.items()):
            code = proc.exitcode
            if code is None:
                continue
            log = (self.workdir / f"{executor}.log").read_text()[-3000:]
            assert code == -signal.SIGKILL, f"worker {executor} exited with {code}: {log}"
            dead.append(executor)
            del self.procs[executor]
        return dead

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()  # SIGTERM: the worker stops DBOS and exits
        for proc in self.procs.values():
            proc.join(timeout=30)
            if proc.exitcode is None:
                proc.kill()
                proc.join(timeout=10)


async def finished(dsn: str, session_id: str) -> bool:
    store = await PostgresStore.open(dsn, create=False)
    try:
        session = await store.get_session(session_id)
    finally:
        await store.close()
    return session is not None and session.status == "done"


async def run_session(
    workdir: Path, dsn: str, base_url: str, points: list[KillPoint] | None
) -> Chain:
    """Submit the scenario to three workers; replace each killed worker until it is done."""
    workdir.mkdir(parents=True)
    plan = iter(points or [])
    pool = Pool(workdir, dsn, base_url)
    chain = Chain(workdir, dsn=dsn)
    try:
        for _ in range(WORKERS):
            pool.start(next(plan, None))
        await pool.ready()
        async with Runtime(db=dsn) as rt:
            chain.session_id = await rt.submit(ROOT, TASK)
        with anyio.fail_after(DEADLINE):
            clock = 0.0
            while not await finished(dsn, chain.session_id):
                await anyio.sleep(0.05)
                clock += 0.05
                for proc, after in list(pool.timers):
                    if clock >= after and proc.exitcode is None:
                        proc.kill()
                        pool.timers.remove((proc, after))
                for _ in pool.killed():
                    kill = next(plan, None) if len(chain.kills) < MAX_KILLS else None
                    chain.kills.append(kill or KillPoint("none", 0))
                    pool.start(kill)
    finally:
        pool.stop()
    return chain


async def test_three_workers_killed_anywhere_finish_exactly_once(
    tmp_path: Path, postgres_cluster: Cluster
) -> None:
    switch = KillSwitch(ScenarioModel())
    async with MessagesServer(policy=switch) as server:
        reference_db = create_database(postgres_cluster)
        first = await run_session(tmp_path / "reference", reference_db, server.base_url, None)
        assert first.session_id is not None and not first.kills
        reference = transcript(reference_db, first.session_id)
        assert reference.session[0] == "done" and reference.tool_results
        sent = request_keys(server.log)
        assert not check_chain(first, reference, server.log, sent)

        events = [e for e in IN_PROCESS_EVENTS if e != "summary"] + ["summary", "timer"]
        points = random_kill_points(random.Random(SEED), events)
        killed = 0
        chains = 0
        kinds: Counter[str] = Counter()
        while killed < MIN_KILLS and chains < 6:
            chains += 1
            log_start = len(server.log)
            dsn = create_database(postgres_cluster)
            planned = [next(points) for _ in range(MAX_KILLS)]
            chain = await run_session(tmp_path / f"chain-{chains}", dsn, server.base_url, planned)
            problems = check_chain(chain, reference, server.log[log_start:], sent)
            assert not problems, (
                f"chain {chains}, killed at {[str(k) for k in chain.kills]}:\n"
                + "\n".join(problems)
            )
            killed += len(chain.kills)
            kinds.update(k.event for k in chain.kills)
    assert killed >= MIN_KILLS, kinds
    print(f"killed {killed} workers in {chains} sessions: {dict(kinds)}")
