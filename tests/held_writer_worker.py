"""``anabranch worker`` whose store writes the test can hold: SIGUSR1 holds every commit of
its store (its writer's thread, as an overloaded worker's queue holds them), SIGUSR2 lets
them go; its event loop runs on meanwhile. SIGHUP blocks the event loop itself (as a tool
that blocks it would) until the file ``HELD.go`` exists.
``python -m tests.held_writer_worker HELD ARGS``: ARGS as for ``anabranch worker``; the
file HELD exists while the commits are held."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import Any

import anyio

import anabranch.runtime._worker as worker
from anabranch.cli import main

_serve = worker.serve


async def serve(runtime: Any, dsn: str, options: Any, **kwargs: Any) -> None:
    writer: anyio.CapacityLimiter = runtime.store._connections._write_thread
    flag = Path(sys.argv[1])
    released = anyio.Event()

    async def hold() -> None:
        async with writer:
            flag.touch()
            await released.wait()
            flag.unlink()

    async def listen() -> None:
        nonlocal released
        with anyio.open_signal_receiver(signal.SIGUSR1, signal.SIGUSR2) as signals:
            async for signum in signals:
                if signum == signal.SIGUSR1:
                    released = anyio.Event()
                    group.start_soon(hold)
                else:
                    released.set()

    def block_the_loop() -> None:
        go = flag.with_suffix(".go")
        while not go.exists():
            time.sleep(0.05)

    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, block_the_loop)
    async with anyio.create_task_group() as group:
        group.start_soon(listen)
        await _serve(runtime, dsn, options, **kwargs)
        group.cancel_scope.cancel()


if __name__ == "__main__":
    worker.serve = serve
    sys.exit(main(["worker", *sys.argv[2:]]))
