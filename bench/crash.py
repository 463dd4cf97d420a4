"""Crash benchmark: the crash test at hundreds of kill points (not run in CI).

    PYTHONPATH=src python bench/crash.py --kills 500 [--backend asyncio|trio|both]
        [--kind agent|graph] [--synchronous FULL|NORMAL] [--seed N] [--keep DIR]

Runs an uninterrupted reference session, then chains of SIGKILLed-and-resumed attempts
(see ``tests/crash/harness.py``) until ``--kills`` attempts per backend were killed, and
checks every finished chain against the reference. Prints kills per kind of point, time,
and every problem found; exits 1 if there was any.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.crash.harness import (
    ALL_EVENTS,
    Harness,
    KillSwitch,
    check_chain,
    random_kill_points,
    request_keys,
    transcript,
)
from tests.crash.scenario import ScenarioModel

from anabranch.testing import MessagesServer


async def bench(args: argparse.Namespace, backend: str, workdir: Path) -> int:
    switch = KillSwitch(ScenarioModel())
    failures = 0
    async with MessagesServer(policy=switch) as server:
        harness = Harness(
            server.base_url, backend, switch, synchronous=args.synchronous, kind=args.kind
        )
        first = await harness.run_chain(workdir / "reference", [])
        assert first.session_id is not None
        reference = transcript(first.db, first.session_id)
        sent = request_keys(server.log)
        compacts = any(run[5] for run in reference.runs)
        events = [e for e in ALL_EVENTS if e != "summary" or compacts]
        points = random_kill_points(random.Random(f"{args.seed}-{backend}"), events)
        killed: Counter[str] = Counter()
        chains = attempts = 0
        started = time.monotonic()
        while sum(killed.values()) < args.kills:
            chains += 1
            log_start = len(server.log)
            chain = await harness.run_chain(workdir / f"chain-{chains}", points)
            attempts += chain.attempts
            killed.update(k.event for k in chain.kills)
            problems = check_chain(chain, reference, server.log[log_start:], sent)
            if problems:
                failures += 1
                print(f"[{backend}] chain {chains} killed at {[str(k) for k in chain.kills]}:")
                for problem in problems:
                    print("   ", problem)
        seconds = time.monotonic() - started
    total = sum(killed.values())
    print(
        f"[{backend}] {args.kind} synchronous={args.synchronous} kills={total} chains={chains} "
        f"attempts={attempts} failed_chains={failures} time={seconds:.1f}s "
        f"({seconds / attempts * 1000:.0f} ms/attempt)"
    )
    by_point = ", ".join(f"{k}={v}" for k, v in sorted(killed.items()))
    print(f"[{backend}] kills by point: {by_point}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=500)
    parser.add_argument("--backend", choices=["asyncio", "trio", "both"], default="both")
    parser.add_argument("--kind", choices=["agent", "graph"], default="agent")
    parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="FULL")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="keep the databases and logs here")
    args = parser.parse_args()
    backends = ["asyncio", "trio"] if args.backend == "both" else [args.backend]
    failures = 0
    with tempfile.TemporaryDirectory() as temporary:
        root = args.keep or Path(temporary)
        for backend in backends:
            failures += anyio.run(bench, args, backend, root / backend, backend=backend)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
