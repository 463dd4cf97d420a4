"""A benchmark worker: ``serve()`` with the concurrency benchmark's latency model and
agent, on PostgreSQL. ``python -m bench.pg_worker DSN EXECUTOR CONCURRENCY LATENCY READY``
(creates the file READY once it serves the queue)."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

from anabranch import Runtime
from anabranch.runtime._worker import WorkerOptions, serve
from bench.common import noop_tracer_provider
from bench.concurrency import LatencyModel, worker_agent


async def main(dsn: str, executor: str, concurrency: int, latency: float, ready: Path) -> None:
    provider, _ = noop_tracer_provider()  # tracing on, like the SQLite benchmark
    async with Runtime(
        db=dsn, model=LatencyModel(latency), tracer_provider=provider, agents=[worker_agent()]
    ) as rt:
        options = WorkerOptions(executor_id=executor, concurrency=concurrency, polling_interval=0.1)
        await serve(rt, dsn, options, on_ready=lambda _: ready.touch())


if __name__ == "__main__":
    dsn, executor, concurrency, latency, ready = sys.argv[1:6]
    anyio.run(main, dsn, executor, int(concurrency), float(latency), Path(ready))
