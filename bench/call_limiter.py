"""Benchmark: what a shared rate limit adds to every model call, two ways.

    python bench/call_limiter.py [--calls 200] [--out FILE]

1. ``PostgresCallLimiter``: grant and settle one call (two short transactions on the
   database clock), sequentially, with a limit that never binds.
2. The DBOS alternative: every model call as its own workflow on a DBOS queue with a
   limiter (DBOS's limiter counts workflow starts), enqueued and awaited, with the body
   doing nothing; at the polling interval our workers use (0.2 s) and DBOS's default (1 s).

Both against one private PostgreSQL on this machine (fsync on). Latency added per call,
median and 95th percentile; nothing here is a test: timings never gate anything.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for entry in (ROOT, ROOT / "src"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

import anyio  # noqa: E402
from tests.postgres_cluster import create_database, start_cluster  # noqa: E402

from bench.common import machine_info  # noqa: E402


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": statistics.median(ordered) * 1e3,
        "p95_ms": ordered[int(len(ordered) * 0.95) - 1] * 1e3,
    }


async def limiter_latency(dsn: str, calls: int) -> dict[str, float]:
    from anabranch.models import CallRate, PostgresCallLimiter

    rate = CallRate(requests=1_000_000, tokens=10**12, period=60, name="bench")
    samples = []
    async with PostgresCallLimiter(dsn, rate) as limiter:
        for _ in range(calls):
            start = time.perf_counter()
            ticket = await limiter.acquire(1000)
            await limiter.settle(ticket, 1200)
            samples.append(time.perf_counter() - start)
    return summary(samples)


def dbos_latency(dsn: str, calls: int, polling: float) -> dict[str, float]:
    from dbos import DBOS, DBOSClient

    @DBOS.workflow(name=f"bench.model_call.{polling}")
    def model_call(i: int) -> int:
        return i

    DBOS(
        config={
            "name": "bench-limiter",
            "system_database_url": dsn,
            "executor_id": "bench",
            "application_version": "bench-v1",
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    queue = f"calls{int(polling * 10)}"
    DBOS.register_queue(
        queue,
        limiter={"limit": 1_000_000, "period": 60},
        polling_interval_sec=polling,
        on_conflict="always_update",
    )
    client = DBOSClient(system_database_url=dsn)
    samples = []
    try:
        for i in range(calls):
            start = time.perf_counter()
            handle = client.enqueue(
                {
                    "workflow_name": f"bench.model_call.{polling}",
                    "queue_name": queue,
                    "app_version": "bench-v1",
                },
                i,
            )
            handle.get_result()
            samples.append(time.perf_counter() - start)
    finally:
        client.destroy()
        DBOS.destroy(destroy_registry=True)
    return summary(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "call_limiter.json")
    args = parser.parse_args()
    out: dict[str, Any] = {"machine": machine_info(), "calls": args.calls}
    with start_cluster(durable=True) as cluster:
        dsn = create_database(cluster)
        out["postgres_call_limiter"] = anyio.run(limiter_latency, dsn, args.calls)
        print("PostgresCallLimiter:", out["postgres_call_limiter"], flush=True)
        for polling in (0.2, 1.0):
            dsn = create_database(cluster)
            key = f"dbos_queue_per_call_polling_{polling:g}s"
            out[key] = dbos_latency(dsn, max(args.calls // 4, 20), polling)
            print(f"DBOS queue per call (polling {polling:g} s):", out[key], flush=True)
    out["ratio_dbos_0.2s_over_limiter"] = (
        out["dbos_queue_per_call_polling_0.2s"]["median_ms"]
        / out["postgres_call_limiter"]["median_ms"]
    )
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
