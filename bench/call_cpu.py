"""Probes for CPU per model call in the 1,000-concurrent-runs benchmark (issue 12).

    python -m bench.call_cpu trial [--tracing on|off] [--runs N]
    python -m bench.call_cpu counts [--tracing on|off] [--runs N]
    python -m bench.call_cpu calls [--tracing on|off] [--runs N] [--out FILE.prof]
    python -m bench.call_cpu census [--generation 0|1|2] [--tracing on|off] [--runs N]
    python -m bench.call_cpu pairs BEFORE_DIR AFTER_DIR [--pairs N] [--tracing on|off]

Each runs ``bench.concurrency.trial(folder, runs, 0.2)`` (supervisor mix) and prints one
JSON object. On a shared host the CPU figure of one trial moves by 25-40% within hours,
so only these are evidence: ``counts`` and ``calls`` (counted, not timed: the same for the
same code whatever the load) and ``pairs`` (before and after trials alternated in one run,
judged by the ratio within each pair). ``pairs`` runs this probe from each checkout's own
``src`` and ``bench`` (each needs a ``.venv``, a symlink to one will do).

- ``trial``: CPU and GC milliseconds per model call, collections, checks.
- ``counts``: per model call, store submits, commits and writes per commit, event-loop
  handles and loop iterations, the SQLite writer thread's CPU; collections per 1k calls.
- ``calls``: Python function calls per model call under cProfile (a coroutine's every
  resume counts as a call), and the profile written for ``pstats``.
- ``census``: the types of the objects in one generation when the collector starts on it
  (for generation 2, the whole heap, once), per collection sampled.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from bench.concurrency import trial

LATENCY = 0.2


def run_trial(tracing: bool, runs: int = 1000) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        result: dict[str, Any] = anyio.run(trial, Path(folder), runs, LATENCY, "FULL", tracing)
    return result


def summary(result: dict[str, Any]) -> dict[str, Any]:
    keys = ("cpu_ms_per_model_call", "gc_ms_per_model_call", "gc_collections")
    # a tree from before the GC figures (acd7224, the baseline) has only the CPU
    return {k: result.get(k) for k in keys} | {
        "model_calls": result["model_calls"],
        "all_complete": result["all_complete"],
    }


def counts(tracing: bool, runs: int = 1000) -> dict[str, Any]:
    """Counted figures per model call (wrappers installed for this process only)."""
    from anabranch.store import _group_commit
    from anabranch.store.sqlite import _group_commit as sqlite_commit

    n: Counter[str] = Counter()
    writer = [0.0]
    real_submit = _group_commit.GroupCommit.submit
    real_init = _group_commit.GroupCommit.__init__
    real_batch = sqlite_commit._commit_batch
    real_handle = asyncio.events.Handle.__init__
    real_once = asyncio.base_events.BaseEventLoop._run_once  # type: ignore[attr-defined]

    def submit(self: Any, job: Any) -> Any:
        n["submits"] += 1
        return real_submit(self, job)

    def init(self: Any, commit: Callable[[list[Any]], Any]) -> None:
        async def counted(writes: list[Any]) -> None:
            n["commits"] += 1
            n["writes"] += len(writes)
            await commit(writes)

        real_init(self, counted)

    def commit_batch(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return real_batch(*args, **kwargs)
        finally:
            writer[0] += time.thread_time() - started

    def handle(self: Any, *args: Any, **kwargs: Any) -> None:
        n["handles"] += 1
        real_handle(self, *args, **kwargs)

    def once(self: Any) -> None:
        n["iterations"] += 1
        real_once(self)

    patches: list[tuple[Any, str, Any]] = [
        (_group_commit.GroupCommit, "submit", submit),
        (_group_commit.GroupCommit, "__init__", init),
        (sqlite_commit, "_commit_batch", commit_batch),
        (asyncio.events.Handle, "__init__", handle),
        (asyncio.base_events.BaseEventLoop, "_run_once", once),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        result = run_trial(tracing, runs)
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
    calls = result["model_calls"]
    out: dict[str, Any] = {key: round(n[key] / calls, 3) for key in ("submits", "commits")}
    out["writes_per_commit"] = round(n["writes"] / max(n["commits"], 1), 1)
    out["handles"] = round(n["handles"] / calls, 3)
    out["loop_iterations"] = round(n["iterations"] / calls, 3)
    out["writer_thread_ms"] = round(writer[0] * 1e3 / calls, 4)
    out["collections_per_1k_calls"] = [round(c * 1e3 / calls, 2) for c in result["gc_collections"]]
    out["all_complete"] = result["all_complete"]
    return out


def function_calls(tracing: bool, out: Path, runs: int = 1000) -> dict[str, Any]:
    profile = cProfile.Profile()
    profile.enable()
    result = run_trial(tracing, runs)
    profile.disable()
    profile.dump_stats(out)
    stats: Any = pstats.Stats(str(out)).stats
    total = sum(entry[1] for entry in stats.values())
    calls = result["model_calls"]
    return {"function_calls_per_model_call": round(total / calls, 1), "profile": str(out)}


def census(generation: int, tracing: bool, runs: int = 1000, every: int = 4) -> dict[str, Any]:
    """Object types in ``generation`` at the start of every ``every``-th collection of it
    (for generation 2, the whole heap at the trial's second full collection)."""
    found: Counter[str] = Counter()
    seen = [0, 0]  # collections of the generation, samples taken

    def name(obj: object) -> str:
        kind = type(obj)
        label = f"{kind.__module__}.{kind.__qualname__}"
        if kind.__name__ == "coroutine":
            label += ":" + getattr(obj, "__qualname__", "?")
        return label

    def sample(phase: str, info: dict[str, int]) -> None:
        if phase != "start" or info["generation"] != generation:
            return
        seen[0] += 1
        wanted = seen[0] == 2 if generation == 2 else seen[0] % every == 0
        if not wanted:
            return
        gc.callbacks.remove(sample)  # get_objects allocates: no census of the census
        try:
            objects = gc.get_objects() if generation == 2 else gc.get_objects(generation)
            found.update(name(obj) for obj in objects)
            seen[1] += 1
            del objects
        finally:
            gc.callbacks.append(sample)

    gc.callbacks.append(sample)
    try:
        run_trial(tracing, runs)
    finally:
        gc.callbacks.remove(sample)
    samples = max(seen[1], 1)
    top = {key: round(count / samples, 1) for key, count in found.most_common(60)}
    return {
        "generation": generation,
        "samples": seen[1],
        "objects": round(sum(found.values()) / samples),
        "per_sample": top,
    }


def _commit(tree: Path) -> str:
    """The checked-out commit of a tree (what a recorded pair compares)."""
    done = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.stdout.strip() or str(tree)


def pairs(before: Path, after: Path, count: int, tracing: bool) -> dict[str, Any]:
    """Alternated trials of two checkouts, each from its own ``src`` and ``.venv``."""

    def one(tree: Path) -> float:
        # this probe's own file, the tree's engine and bench (a tree from before the probe
        # existed can be measured too)
        command = [str(tree / ".venv" / "bin" / "python"), str(Path(__file__).resolve()), "trial"]
        command += ["--tracing", "on" if tracing else "off"]
        env = os.environ | {"PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree}"}
        done = subprocess.run(
            command, cwd=tree, env=env, capture_output=True, text=True, check=True, timeout=900
        )
        return float(json.loads(done.stdout)["cpu_ms_per_model_call"])

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_start = os.getloadavg()[0]
    rows = []
    for _ in range(count):
        first, second = one(before), one(after)
        rows.append(
            {
                "before": round(first, 4),
                "after": round(second, 4),
                "ratio": round(second / first, 3),
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    ratios = [row["ratio"] for row in rows]
    return {
        "trees": {"before": _commit(before), "after": _commit(after)},
        "started": started,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "tracing": tracing,
        "pairs": rows,
        "median_ratio": round(statistics.median(ratios), 3),
        "under_1": sum(1 for r in ratios if r < 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.call_cpu", description=__doc__)
    parser.add_argument("probe", choices=("trial", "counts", "calls", "census", "pairs"))
    parser.add_argument("trees", nargs="*", type=Path, help="pairs: BEFORE_DIR AFTER_DIR")
    parser.add_argument("--tracing", choices=("on", "off"), default="on")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--generation", type=int, choices=(0, 1, 2), default=1)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path("call_cpu.prof"))
    args = parser.parse_args(argv)
    tracing = args.tracing == "on"
    if args.probe == "pairs" and len(args.trees) != 2:
        parser.error("pairs needs BEFORE_DIR and AFTER_DIR")
    if args.probe == "trial":
        out = summary(run_trial(tracing, args.runs))
    elif args.probe == "counts":
        out = counts(tracing, args.runs)
    elif args.probe == "calls":
        out = function_calls(tracing, args.out, args.runs)
    elif args.probe == "census":
        out = census(args.generation, tracing, args.runs)
    else:
        out = pairs(args.trees[0], args.trees[1], args.pairs, tracing)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
