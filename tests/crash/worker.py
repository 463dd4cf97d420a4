"""A crash-test worker: ``anabranch worker`` serving the crash scenario on PostgreSQL, with
one planned SIGKILL (the kill points of ``driver``, counted from this worker's start).

Started from the fork server (``worker_main``) or as ``python -m tests.crash.worker
SPEC_JSON``; its stderr goes to
``WORKDIR/EXECUTOR.log``, and it creates ``WORKDIR/EXECUTOR.ready`` once it serves the queue.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anthropic
import anyio
import httpx2

from anabranch import Runtime
from anabranch.models._anthropic import AnthropicModel
from anabranch.models._retry import RetryPolicy
from anabranch.runtime._worker import WorkerOptions, serve
from anabranch.store.postgres import PostgresStore
from anabranch.store.postgres._fencing import FencedWrites
from tests.crash import scenario
from tests.crash.driver import Spec, _Counter, _KillingModel, _Transport

T = TypeVar("T")
LEASE_TTL = 1.0


@dataclass(frozen=True)
class WorkerSpec:
    dsn: str
    workdir: str
    base_url: str
    executor_id: str
    kill_event: str | None = None
    kill_at: int = 0

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


def _install_commit_kill(spec: Spec) -> None:
    counter = _Counter(spec, "commit")
    if not counter.active:
        return
    original = PostgresStore._write

    async def write(self: FencedWrites, fn: Callable[[Any], T], **fence: Any) -> T:
        result = await original(self, fn, **fence)
        counter.tick()
        return result

    PostgresStore._write = write  # type: ignore[method-assign]


async def main(worker: WorkerSpec) -> None:
    spec = Spec(
        db=worker.dsn,
        workdir=worker.workdir,
        base_url=worker.base_url,
        backend="asyncio",
        attempt=0,
        kill_event=worker.kill_event,
        kill_at=worker.kill_at,
    )
    scenario.configure(
        effects=spec.effects_file,
        violations=spec.violations_file,
        db=worker.dsn,
        event=worker.kill_event,
        at=worker.kill_at,
    )
    _install_commit_kill(spec)
    client = anthropic.AsyncAnthropic(
        base_url=worker.base_url,
        api_key="crash-test",
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=_Transport(spec), timeout=60.0),
    )
    model = _KillingModel(AnthropicModel(client=client), spec)
    async with Runtime(
        db=worker.dsn,
        model=model,
        retry=RetryPolicy(base_delay=0.01, max_delay=0.05),
        agents=scenario.AGENTS,
        graphs=[scenario.GRAPH],
        lease_ttl=LEASE_TTL,
    ) as rt:
        options = WorkerOptions(
            executor_id=worker.executor_id, concurrency=4, heartbeat=0.2, polling_interval=0.1
        )
        ready = Path(worker.workdir) / f"{worker.executor_id}.ready"
        await serve(rt, worker.dsn, options, on_ready=lambda _: ready.touch())


def worker_main(spec_json: str) -> None:
    """Entry point of one worker (a process forked from the harness's fork server)."""
    given = WorkerSpec(**json.loads(spec_json))
    log = open(Path(given.workdir) / f"{given.executor_id}.log", "a", buffering=1)
    os.dup2(log.fileno(), 2)
    sys.stderr = log
    anyio.run(main, given)


if __name__ == "__main__":
    worker_main(sys.argv[1])
