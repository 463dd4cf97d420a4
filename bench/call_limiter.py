"""Benchmark: what a model-call rate limit adds to every call, before and after a change.

    python bench/call_limiter.py [--calls 300] [--rounds 3] [--before DIR] [--dbos]
                                 [--out FILE]

Trials, each in its own process, alternating the two trees (``--before``: a checkout of
the code before the change; this tree is "after"), ``--rounds`` times each:

- ``postgres``: ``PostgresCallLimiter``, grant and settle one call (two short
  transactions on the database clock), sequentially, with limits that never bind: every
  kind of limit the tree knows (after: requests, input, output and all tokens).
- ``local``: the same with ``LocalCallLimiter`` (one process, no I/O).
- ``wrapped`` and ``bare``: one ``request`` of the offline ``TestModel`` through
  ``RateLimitedModel`` with a ``LocalCallLimiter``, and without any limiter: what the
  whole rate-limited path adds in CPU, and that nothing is added without one.

``--dbos`` adds last round's comparison with the alternative: every model call its own
DBOS workflow on a rate-limited DBOS queue (about a second a call).

Times are per call, median and 95th percentile, from one session on a shared machine
(noisy: compare the ratios); nothing here gates anything.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRIALS = ("postgres", "local", "wrapped", "bare")


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": statistics.median(ordered) * 1e3,
        "p95_ms": ordered[max(0, int(len(ordered) * 0.95) - 1)] * 1e3,
    }


# -- one trial (in its own process, importing the tree under test) ------------------------


def _rate_and_charges() -> tuple[Any, Any, Any]:
    """A never-binding rate over every kind the tree knows, and the (estimate, used)
    arguments its limiters take."""
    from anabranch.models import CallRate

    try:
        from anabranch.models import Charge  # type: ignore[attr-defined, unused-ignore]
    except ImportError:  # before: one combined token count per call
        rate = CallRate(requests=10**9, tokens=10**12, period=60, name="bench")
        return rate, 1000, 1200
    rate = CallRate(
        requests=10**9,
        input_tokens=10**12,
        output_tokens=10**12,
        tokens=10**12,
        period=60,
        name="bench",
    )
    return rate, Charge(1000, 1024), Charge(900, 300)


async def _limiter_trial(limiter: Any, estimate: Any, used: Any, calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        ticket = await limiter.acquire(estimate)
        await limiter.settle(ticket, used)
        samples.append(time.perf_counter() - start)
    return samples


async def _model_trial(wrapped: bool, calls: int) -> list[float]:
    from anabranch.messages import Message, ModelRequest, TextBlock
    from anabranch.models import LocalCallLimiter, RateLimitedModel
    from anabranch.testing import TestModel

    rate, _, _ = _rate_and_charges()
    inner = TestModel()
    model: Any = RateLimitedModel(inner, LocalCallLimiter(rate)) if wrapped else inner
    request = ModelRequest(
        model="m",
        messages=[Message(role="user", content=[TextBlock(text="summarise the notes " * 20)])],
        max_tokens=1024,
    )
    samples = []
    for _ in range(calls):
        start = time.process_time()
        await model.request(request)
        samples.append(time.process_time() - start)
    return samples


async def run_trial(trial: str, dsn: str | None, calls: int) -> dict[str, float]:
    if trial in ("wrapped", "bare"):
        return summary(await _model_trial(trial == "wrapped", calls))
    rate, estimate, used = _rate_and_charges()
    if trial == "local":
        from anabranch.models import LocalCallLimiter

        return summary(await _limiter_trial(LocalCallLimiter(rate), estimate, used, calls))
    from anabranch.models import PostgresCallLimiter

    assert dsn is not None
    async with PostgresCallLimiter(dsn, rate) as limiter:
        await _limiter_trial(limiter, estimate, used, 20)  # warm the connection
        return summary(await _limiter_trial(limiter, estimate, used, calls))


# -- the session: alternate the trees, one process per trial ------------------------------


def _trial_process(src: Path, trial: str, dsn: str | None, calls: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src / "src"), str(ROOT)])}
    command = [sys.executable, __file__, "--trial", trial, "--calls", str(calls)]
    if dsn is not None:
        command += ["--dsn", dsn]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=600, check=True
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def session(before: Path, calls: int, rounds: int, dbos: bool) -> dict[str, Any]:
    sys.path[:0] = [str(ROOT), str(ROOT / "src")]
    from tests.postgres_cluster import create_database, start_cluster

    from bench.common import machine_info

    out: dict[str, Any] = {
        "machine": machine_info(),
        "load_average_at_start": os.getloadavg(),
        "calls_per_trial": calls,
        "rounds": rounds,
    }
    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        tree: {trial: [] for trial in TRIALS} for tree in ("before", "after")
    }
    with start_cluster(durable=True) as cluster:
        for _ in range(rounds):
            for trial in TRIALS:
                for tree, src in (("before", before), ("after", ROOT)):
                    dsn = create_database(cluster) if trial == "postgres" else None
                    runs[tree][trial].append(_trial_process(src, trial, dsn, calls))
        if dbos:
            for polling in (0.2, 1.0):
                key = f"dbos_queue_per_call_polling_{polling:g}s"
                out[key] = dbos_latency(create_database(cluster), max(calls // 6, 20), polling)
    out["load_average_at_end"] = os.getloadavg()
    for tree in ("before", "after"):
        out[tree] = {trial: _median_of(runs[tree][trial]) for trial in TRIALS}
    after, previous = out["after"], out["before"]
    out["ratios_after_over_before"] = {
        trial: after[trial]["median_ms"] / previous[trial]["median_ms"] for trial in TRIALS
    }
    out["wrapped_over_bare_after"] = after["wrapped"]["median_ms"] / after["bare"]["median_ms"]
    return out


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
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, help="a checkout of the code before the change")
    parser.add_argument("--dbos", action="store_true", help="also time a DBOS queue per call")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "call_limiter.json")
    parser.add_argument("--trial", choices=TRIALS, help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trial is not None:
        import anyio

        print(json.dumps(anyio.run(run_trial, args.trial, args.dsn, args.calls)))
        return
    before = args.before or ROOT  # without a before tree: this tree against itself
    out = session(before.resolve(), args.calls, args.rounds, args.dbos)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: out[k] for k in ("before", "after", "ratios_after_over_before")}))


if __name__ == "__main__":
    main()
