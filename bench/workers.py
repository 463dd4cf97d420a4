"""Benchmark: 1, 2 and 4 worker processes against one PostgreSQL, next to a raw-psycopg
insert floor and one process on SQLite.

    python bench/workers.py [--sessions 1000,10000] [--workers 1,2,4] [--latency 0.2]
                            [--out FILE] [--no-sqlite]

Every session is the concurrency benchmark's root agent (``bench/concurrency.py``, mix
``root``): 10 model calls answered after ``latency`` seconds by a prebuilt response, 9 tool
calls; ideal wall time 10 x latency whatever the count. For each worker count: a fresh
database, the sessions created and enqueued (one transaction for the whole queue, so
dispatch starts at once), the workers already serving with concurrency = sessions /
workers, so every session runs at once. Measured from the commit of the queue to the last
session done: sessions per second, wall over ideal, worker CPU (and the PostgreSQL
server's) per model call. PostgreSQL runs with its durable defaults (``fsync`` on).

Next to each trial, the CPU lower bound: ``model calls x (worker + server CPU per call) /
cores``, the wall time the measured CPU alone needs on this machine however well it
overlaps with the model latency, over the ideal wall time. When it is above the goal, the
goal is out of reach on this machine whatever else is done. Nothing here is a test:
timings never gate anything.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for entry in (ROOT, ROOT / "src"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

import anyio  # noqa: E402
from tests.postgres_cluster import Cluster, create_database, start_cluster  # noqa: E402

from bench import concurrency  # noqa: E402
from bench.common import machine_info  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def server_pids(cluster: Cluster) -> list[int]:
    """The postmaster of ``cluster`` and its children (backends, writer, WAL writer…)."""
    postmaster = int((cluster.data / "postmaster.pid").read_text().split()[0])
    pids = [postmaster]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == postmaster:
            pids.append(int(stat.parent.name))
    return pids


def server_cpu(cluster: Cluster) -> float:
    total = 0.0
    for pid in server_pids(cluster):
        try:
            total += cpu_of(pid)
        except OSError:
            pass
    return total


def insert_floor(dsn: str, rows: int = 3000) -> dict[str, float]:
    """Raw psycopg: 2 KB inserts, one commit each and 100 per commit."""
    import psycopg

    payload = "x" * 2048
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE floor (id bigserial PRIMARY KEY, body text)")
        start = time.perf_counter()
        for _ in range(rows):
            conn.execute("INSERT INTO floor (body) VALUES (%s)", (payload,))
        single = rows / (time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(rows // 100):
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany("INSERT INTO floor (body) VALUES (%s)", [(payload,)] * 100)
        batched = rows / (time.perf_counter() - start)
    return {"commits_per_s": single, "rows_per_s_batched_100": batched}


async def enqueue_all(dsn: str, count: int) -> list[str]:
    """Create ``count`` sessions, then put them all on the queue in one transaction."""
    import sqlalchemy as sa
    from dbos import DBOS, DBOSClient

    from anabranch import Runtime
    from anabranch.runtime._dispatch import APP_VERSION, DEFAULT_QUEUE, WORKFLOW_NAME

    agent = concurrency.worker_agent()
    ids: list[str] = []
    async with Runtime(db=dsn) as rt:

        async def create(index: int) -> None:
            ids.append(
                await rt.open_session(
                    kind="agent",
                    entry=agent.name,
                    task=f"task {index}: work through the steps",
                    source=None,
                    outline={},
                    on_session=None,
                    drive=False,
                )
            )

        async with anyio.create_task_group() as group:  # concurrent: group-committed
            for index in range(count):
                group.start_soon(create, index)

    def enqueue() -> None:
        DBOS.migrate(dsn)
        client = DBOSClient(system_database_url=dsn)
        engine = sa.create_engine(dsn.replace("postgresql://", "postgresql+psycopg://"))
        try:
            with engine.begin() as conn:
                for session_id in ids:
                    client.enqueue_in_transaction(
                        conn,
                        {
                            "workflow_name": WORKFLOW_NAME,
                            "queue_name": DEFAULT_QUEUE,
                            "workflow_id": session_id,
                            "app_version": APP_VERSION,
                        },
                        session_id,
                    )
        finally:
            engine.dispose()
            client.destroy()

    await anyio.to_thread.run_sync(enqueue)
    return ids


FAILOVER_SQL = """
SELECT
  count(*) FILTER (WHERE last = 'done'),
  count(*) FILTER (WHERE reopened),
  (SELECT count(*) FROM anabranch.leases WHERE epoch > 1)
FROM (
  SELECT s.id,
    (SELECT status FROM anabranch.session_events e WHERE e.session_id = s.id
     ORDER BY id DESC LIMIT 1) AS last,
    EXISTS (SELECT 1 FROM anabranch.session_events d JOIN anabranch.session_events r
            ON r.session_id = d.session_id AND r.id > d.id
            WHERE d.session_id = s.id AND d.status = 'done' AND r.status = 'running') AS reopened
  FROM anabranch.sessions s
) per_session
"""
"""Sessions whose latest status is done; sessions with a ``running`` row after a ``done``
(a finished session re-opened); sessions whose lease was taken again after the first
time (a takeover, or a second drive)."""


def recoveries(log: str) -> int:
    """Sessions a worker's log says it handed back to the queue (a dead worker's, or one
    whose lease expired), during the trial or at its end."""
    dead = sum(int(n) for n in re.findall(r"is dead: (\d+) sessions back on the queue", log))
    return dead + log.count("back on the queue") - log.count("sessions back on the queue")


async def done_count(dsn: str) -> int:
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT count(*) FROM anabranch.sessions s WHERE (SELECT status FROM "
            "anabranch.session_events e WHERE e.session_id = s.id ORDER BY id DESC LIMIT 1) "
            "IN ('done', 'failed')"
        )
        row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def until(condition: Any, deadline: float) -> None:
    with anyio.fail_after(deadline):
        while True:
            if condition():
                return
            await anyio.sleep(0.05)


async def trial(cluster: Cluster, sessions: int, workers: int, latency: float) -> dict[str, Any]:
    dsn = create_database(cluster)
    workdir = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}"}
    # the schemas first, so the workers do not race to create them
    from anabranch.store import PostgresStore

    await (await PostgresStore.open(dsn)).close()
    await anyio.to_thread.run_sync(__import__("dbos").DBOS.migrate, dsn)
    procs = []
    per_worker = -(-sessions // workers)
    for i in range(workers):
        ready = workdir / f"w{i}.ready"
        procs.append(
            subprocess.Popen(  # noqa: ASYNC220 - started once per trial, before timing
                [
                    sys.executable,
                    "-m",
                    "bench.pg_worker",
                    dsn,
                    f"bench-{i}",
                    str(per_worker),
                    str(latency),
                    str(ready),
                ],
                env=env,
                cwd=ROOT,
                stderr=open(workdir / f"w{i}.log", "w"),
            )
        )
    await until(lambda: all((workdir / f"w{i}.ready").exists() for i in range(workers)), 300)
    worker_cpu0 = sum(cpu_of(p.pid) for p in procs)
    server_cpu0 = server_cpu(cluster)
    enqueue_start = time.perf_counter()
    await enqueue_all(dsn, sessions)
    start = time.perf_counter()
    poll = min(0.5, max(0.05, sessions / 5000))  # the count costs server CPU at 10,000
    with anyio.fail_after(3600):
        while True:
            if await done_count(dsn) >= sessions:
                break
            await anyio.sleep(poll)
    wall = time.perf_counter() - start
    worker_cpu = sum(cpu_of(p.pid) for p in procs) - worker_cpu0
    pg_cpu = server_cpu(cluster) - server_cpu0
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=60)
    import psycopg

    with psycopg.connect(dsn) as conn:
        ok_calls = conn.execute(
            "SELECT count(*) FROM anabranch.call_outcomes WHERE status = 'ok'"
        ).fetchone()[0]  # type: ignore[index]
        done_rows = conn.execute(
            "SELECT count(*) FROM anabranch.session_events WHERE status = 'done'"
        ).fetchone()[0]  # type: ignore[index]
        failover = conn.execute(FAILOVER_SQL).fetchone()
        assert failover is not None
        done, reopened, reacquired = failover
    recovered = sum(recoveries((workdir / f"w{i}.log").read_text()) for i in range(workers))
    ideal = concurrency.CALLS_PER_RUN * latency
    return {
        "workers": workers,
        "sessions": sessions,
        "enqueue_s": start - enqueue_start,
        "wall_s": wall,
        "ideal_s": ideal,
        "wall_over_ideal": wall / ideal,
        "sessions_per_s": sessions / wall,
        "model_calls": ok_calls,
        "worker_cpu_ms_per_model_call": worker_cpu / max(ok_calls, 1) * 1e3,
        "postgres_cpu_ms_per_model_call": pg_cpu / max(ok_calls, 1) * 1e3,
        "sessions_done": done,
        "done_rows": done_rows,
        "sessions_reopened_after_done": reopened,
        "sessions_leased_again": reacquired,
        "recoveries_logged": recovered,
        "all_complete": done == sessions
        and done_rows == sessions
        and ok_calls == sessions * concurrency.CALLS_PER_RUN,
    }


async def sqlite_figures(sessions: int, latency: float) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="bench-sqlite-"))
    result = await concurrency.trial(folder, sessions, latency, mix="root")
    return {
        key: result[key]
        for key in (
            "runs",
            "wall_s",
            "ideal_s",
            "wall_over_ideal",
            "cpu_ms_per_model_call",
            "all_complete",
        )
    } | {"sessions_per_s": result["sessions"] / result["wall_s"]}


def lower_bound(trial: dict[str, Any], cores: int) -> dict[str, float]:
    """The wall time the measured CPU alone needs on ``cores`` cores, over the ideal."""
    per_call = trial["worker_cpu_ms_per_model_call"] + trial["postgres_cpu_ms_per_model_call"]
    wall = trial["model_calls"] * per_call / 1e3 / cores
    return {
        "cpu_ms_per_model_call": per_call,
        "cpu_bound_wall_s": wall,
        "cpu_bound_over_ideal": wall / trial["ideal_s"],
        "cores_for_goal_1_5x": trial["model_calls"] * per_call / 1e3 / (1.5 * trial["ideal_s"]),
    }


async def run_size(
    cluster: Cluster,
    sessions: int,
    counts: list[int],
    latency: float,
    out: dict[str, Any],
    save: Callable[[], None],
    sqlite: bool = True,
) -> None:
    """Every worker count at ``sessions`` concurrent agents, then one SQLite process, into
    ``out`` (``save`` writes the figures so far after each)."""
    cores = os.cpu_count() or 1
    out["trials"] = []
    for workers in counts:
        result = await trial(cluster, sessions, workers, latency)
        result["lower_bound"] = lower_bound(result, cores)
        result["load_average_after"] = os.getloadavg()
        out["trials"].append(result)
        out["scaling_per_worker"] = scaling(out["trials"])
        save()
        print(
            f"{workers} workers, {sessions} sessions: {result['sessions_per_s']:.1f} "
            f"sessions/s, wall {result['wall_s']:.2f} s ({result['wall_over_ideal']:.2f}x "
            f"ideal; CPU bound {result['lower_bound']['cpu_bound_over_ideal']:.2f}x), worker "
            f"CPU {result['worker_cpu_ms_per_model_call']:.2f} ms/call, PostgreSQL CPU "
            f"{result['postgres_cpu_ms_per_model_call']:.2f} ms/call, complete "
            f"{result['all_complete']}",
            flush=True,
        )
    if not sqlite:
        return
    out["sqlite_one_process"] = await sqlite_figures(sessions, latency)
    save()
    print(f"SQLite, one process, {sessions} sessions: {out['sqlite_one_process']}", flush=True)


def scaling(trials: list[dict[str, Any]]) -> dict[str, float]:
    """Throughput per worker against the fewest workers' (1.0 = perfect scaling)."""
    base = min(trials, key=lambda t: t["workers"])
    per_worker = base["sessions_per_s"] / base["workers"]
    return {str(t["workers"]): t["sessions_per_s"] / (per_worker * t["workers"]) for t in trials}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    counts = [int(n) for n in args.workers.split(",")]
    sizes = [int(n) for n in args.sessions.split(",")]
    out: dict[str, Any] = {"machine": machine_info(), "latency_s": args.latency, "sizes": {}}
    out["load_average_start"] = os.getloadavg()

    def save() -> None:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")

    with start_cluster(durable=True) as cluster:
        out["insert_floor"] = insert_floor(create_database(cluster))
        print(f"raw psycopg floor: {out['insert_floor']}", flush=True)
        for sessions in sizes:
            figures: dict[str, Any] = {}
            out["sizes"][str(sessions)] = figures
            await run_size(
                cluster, sessions, counts, args.latency, figures, save, sqlite=not args.no_sqlite
            )
    out["load_average_end"] = os.getloadavg()
    save()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", default="1000,10000", help="comma-separated sizes")
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--out", default=str(ROOT / "bench" / "workers.json"))
    parser.add_argument("--no-sqlite", action="store_true", help="skip the SQLite figures")
    args = parser.parse_args()
    anyio.run(run, args)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
