"""What one model call adds to the heap for the length of the model's latency.

At each model call of ``bench/concurrency.py``'s runs (one root run, or ``--supervisor``:
a supervisor and its two workers), after a full collection: the GC-tracked objects alive
now that were not alive at the previous model call, by type. Objects that live across a
model call's await outlive the cyclic GC's young generations, so this count (deterministic,
unlike CPU) is what the loop's own allocations are measured by. Also: the objects a run
added by its first call.

    PYTHONPATH=src:. .venv/bin/python bench/await_census.py [--supervisor] [--top N]
"""

from __future__ import annotations

import argparse
import collections
import gc
import shutil
import tempfile
import types
from pathlib import Path
from typing import Any

import anyio

import anabranch
from bench import concurrency


def kind(o: object) -> str:
    """A type name; coroutines, functions and bound methods by what they run."""
    if isinstance(o, types.CoroutineType):
        return "coro " + o.cr_code.co_qualname
    if isinstance(o, types.FunctionType):
        return "func " + o.__qualname__
    if isinstance(o, types.MethodType):
        return "method " + getattr(o.__func__, "__qualname__", "?")
    t = type(o)
    return f"{t.__module__}.{t.__qualname__}"


class Census:
    def __init__(self) -> None:
        self.previous: dict[int, object] = {}
        self.before_run: dict[int, object] = {}
        self.per_call: collections.Counter[str] = collections.Counter()
        self.first_call: collections.Counter[str] = collections.Counter()
        self.calls = 0

    def at_call(self) -> None:
        gc.collect()
        now = {id(o): o for o in gc.get_objects()}
        if self.previous:
            self.calls += 1
            self.per_call.update(kind(o) for i, o in now.items() if i not in self.previous)
        elif self.before_run:
            self.first_call.update(kind(o) for i, o in now.items() if i not in self.before_run)
            self.before_run = {}
        self.previous = now  # kept alive until the next call: no id is reused meanwhile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--supervisor", action="store_true")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    census = Census()
    request = concurrency.LatencyModel.request
    run = anabranch.Runtime.run

    async def counted_request(self: concurrency.LatencyModel, req: Any) -> Any:
        census.at_call()
        return await request(self, req)

    async def counted_run(self: anabranch.Runtime, *a: Any, **k: Any) -> Any:
        gc.collect()
        census.before_run = {id(o): o for o in gc.get_objects()}
        return await run(self, *a, **k)

    concurrency.LatencyModel.request = counted_request  # type: ignore[method-assign]
    anabranch.Runtime.run = counted_run  # type: ignore[method-assign]
    mix, runs = ("supervisor", 3) if args.supervisor else ("root", 1)
    folder = Path(tempfile.mkdtemp(prefix="await-census-"))
    try:
        result = anyio.run(lambda: concurrency.trial(folder, runs, 0.002, mix=mix))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    census.previous = {}
    calls = max(census.calls, 1)
    print(
        f"mix={mix} calls counted={census.calls} all_complete={result['all_complete']} "
        f"new objects alive per call={sum(census.per_call.values()) / calls:.2f} "
        f"added by the first run's first call={sum(census.first_call.values())}"
    )
    for name, count in census.per_call.most_common(args.top):
        print(f"{count / calls:8.2f}  {name}")


if __name__ == "__main__":
    main()
