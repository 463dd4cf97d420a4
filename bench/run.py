"""Run anabranch's benchmarks and the comparison frameworks side by side.

    python bench/run.py [--quick] [--only persistence,concurrency,...] [--out FILE]

Prints a table and writes ``bench/results.json`` (machine info, package versions, every
figure as min/median/max over repetitions, ratios from figures measured in the same run,
and the goals with whether they are met). ``--quick`` is a smaller run (< 3 min on 2
cores); the full run takes under 30 minutes. Comparison frameworks come from the
``bench`` extra: ``pip install -e '.[bench]'``; a missing one is reported, not fatal.
Nothing here is a test: timings never gate anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for entry in (ROOT, ROOT / "src"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

from bench import common  # noqa: E402

SECTIONS = ("persistence", "concurrency", "resume", "compaction", "cache")


def plan(quick: bool) -> dict[str, Any]:
    if quick:
        return {
            "persistence": {
                "sizes": [100, 500],
                "reps": 2,
                "normal_sizes": [100, 500],
                "max_n": {},
                "reps_for": {500: 1},
            },
            "concurrency": {"counts": [100, 1_000], "reps": 1},
            "resume": {"reps": 3},
            "compaction": {"k": 3},
            "cache": {"turns": 200},
        }
    return {
        # LangGraph re-writes the whole message list at every step, so its cost is
        # quadratic in N: N=2,000 would write tens of GB; it stops at N=500.
        "persistence": {
            "sizes": [100, 500, 2_000],
            "reps": 3,
            "normal_sizes": [100, 500, 2_000],
            "max_n": {"langgraph": 500, "openai-agents": 500},
        },
        "concurrency": {"counts": [100, 1_000, 10_000], "reps": 3, "reps_for": {10_000: 1}},
        "resume": {"reps": 5},
        "compaction": {"k": 3},
        "cache": {"turns": 200},
    }


def log(line: str) -> None:
    print(line, flush=True)


async def run_persistence(folder: Path, settings: dict[str, Any]) -> dict[str, Any]:
    from bench import persistence

    full = await persistence.benchmark(
        folder,
        settings["sizes"],
        settings["reps"],
        synchronous="FULL",
        max_n=settings["max_n"],
        reps_for=settings.get("reps_for"),
        log=log,
    )
    normal = await persistence.benchmark(
        folder,
        settings["normal_sizes"],
        settings["reps"],
        synchronous="NORMAL",
        contenders=["floor", "anabranch"],
        log=log,
    )
    return {"FULL": full, "NORMAL": normal}


async def run_concurrency(folder: Path, settings: dict[str, Any]) -> dict[str, Any]:
    from bench import concurrency

    out: dict[str, Any] = {}
    for runs in settings["counts"]:
        reps = settings.get("reps_for", {}).get(runs, settings["reps"])
        part = await concurrency.benchmark(folder, [runs], reps, log=log)
        out.setdefault("latency_s", part["latency_s"])
        out.setdefault("calls_per_run", part["calls_per_run"])
        out.setdefault("mix", part["mix"])
        out.setdefault("counts", {}).update(part["counts"])
    return out


async def run_resume(folder: Path, settings: dict[str, Any]) -> dict[str, Any]:
    from bench import resume

    return await resume.benchmark(folder, settings["reps"], log=log)


async def run_compaction(folder: Path, settings: dict[str, Any]) -> dict[str, Any]:
    try:
        from bench import compaction
    except ImportError as exc:
        return {"status": "not available yet", "reason": f"{exc}"}
    result: dict[str, Any] = await compaction.benchmark(folder, k=settings.get("k", 3), log=log)
    return result


async def run_cache(folder: Path, settings: dict[str, Any]) -> dict[str, Any]:
    try:
        from bench import cache
    except ImportError as exc:
        return {"status": "not available yet", "reason": f"{exc}"}
    workload = cache.Workload.for_turns(settings["turns"])
    _, _, notes = cache.runtime_parts()
    variants: dict[str, Any] = {}
    for name in cache.VARIANTS:
        result = await cache.run_variant(name, workload, folder / "cache" / name.split()[0])
        variants[name] = {**cache.asdict(result), "read_share": result.read_share}
        log(
            f"  cache {name}: {result.read_share:.1%} of input tokens read from cache, "
            f"{result.model_calls} calls, est. ${result.cost:.4f}"
        )
    return {
        "turns": workload.turns,
        "notes": notes,
        "variants": variants,
        "note": "token counts are deterministic: one repetition",
    }


RUNNERS = {
    "persistence": run_persistence,
    "concurrency": run_concurrency,
    "resume": run_resume,
    "compaction": run_compaction,
    "cache": run_cache,
}


def _median(figure: dict[str, float] | None) -> float:
    return float(figure["median"]) if figure else float("nan")


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals, each with the figure it is judged on and whether it is met."""
    out: list[dict[str, Any]] = []

    def goal(name: str, value: float, target: str, met: bool) -> None:
        out.append({"goal": name, "value": round(value, 3), "target": target, "met": met})

    persistence = results.get("persistence", {}).get("FULL")
    if persistence:
        ours = persistence["contenders"].get("anabranch", {})
        sizes = [int(n) for n in ours]
        if sizes:
            top, low = str(max(sizes)), str(min(sizes))
            ratio = _median(ours[top]["ratio_to_floor"]["tail_per_turn_s"])
            goal(
                f"per-turn time at N={top} within 5x the floor (synchronous=FULL)",
                ratio,
                "<= 5",
                ratio <= 5,
            )
            flat = _median(ours[top]["tail_per_turn_s"]) / _median(ours[low]["tail_per_turn_s"])
            goal(
                f"flat in N: last-10% per-turn time N={top} / N={low}", flat, "<= 1.5", flat <= 1.5
            )
            size = _median(ours[top]["ratio_to_floor"]["bytes_per_turn"])
            goal(f"DB bytes per turn within 1.5x the floor (N={top})", size, "<= 1.5", size <= 1.5)
            if "500" in ours:  # issue 12's target is judged at N = 500
                size = _median(ours["500"]["ratio_to_floor"]["bytes_per_turn"])
                goal("DB bytes per turn within 1.5x the floor (N=500)", size, "<= 1.5", size <= 1.5)
        graph = persistence["contenders"].get("langgraph", {}).get("500")
        if graph and "500" in ours:
            speed = _median(graph["tail_per_turn_s"]) / _median(ours["500"]["tail_per_turn_s"])
            goal("N=500: LangGraph per-turn time / ours", speed, ">= 50", speed >= 50)
            disk = _median(graph["bytes_per_turn"]) / _median(ours["500"]["bytes_per_turn"])
            goal("N=500: LangGraph disk per turn / ours", disk, ">= 50", disk >= 50)
    concurrency = results.get("concurrency", {}).get("counts", {}).get("1000")
    if concurrency:
        wall = _median(concurrency["wall_over_ideal"])
        goal("1,000 concurrent runs: wall time / ideal", wall, "<= 1.3", wall <= 1.3)
        cpu = _median(concurrency["cpu_ms_per_model_call"])  # issue 12's target, tracing on
        goal("1,000 concurrent runs: CPU ms per model call", cpu, "<= 0.5", cpu <= 0.5)
        goal(
            "1,000 concurrent runs: lock errors",
            concurrency["lock_errors"],
            "0",
            concurrency["lock_errors"] == 0 and concurrency["all_complete"],
        )
    resume = results.get("resume", {}).get("ratio_long_to_short")
    if resume:
        for key, label in (
            ("load_s", "context load"),
            ("to_first_request_s", "resume to first model request"),
        ):
            goal(
                f"resume of 10,000 messages within 2x of 100 ({label})",
                resume[key],
                "<= 2",
                resume[key] <= 2,
            )
    cache = results.get("cache", {}).get("variants", {}).get("default")
    if cache:
        goal(
            "cache: share of input tokens read from cache (defaults)",
            cache["read_share"],
            ">= 0.90",
            cache["read_share"] >= 0.9,
        )
    return out


def _persistence_lines(results: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    persistence = results.get("persistence", {})
    for level in ("FULL", "NORMAL"):
        part = persistence.get(level)
        if not part:
            continue
        lines.append(f"\nPersistence per turn (synchronous={level}); ratios are to the floor")
        lines.append(
            f"{'contender':<16}{'N':>6}{'tail ms/turn':>14}{'x floor':>9}"
            f"{'total s':>10}{'B/turn':>9}{'x floor':>9}{'load ms':>9}{'x floor':>9}"
        )
        for name, by_n in part["contenders"].items():
            for n, fig in by_n.items():
                r = fig.get("ratio_to_floor", {})
                lines.append(
                    f"{name:<16}{n:>6}{_median(fig['tail_per_turn_s']) * 1e3:>14.2f}"
                    f"{_median(r.get('tail_per_turn_s')):>9.1f}{_median(fig['total_s']):>10.2f}"
                    f"{_median(fig['bytes_per_turn']):>9.0f}{_median(r.get('bytes_per_turn')):>9.2f}"
                    f"{_median(fig['load_s']) * 1e3:>9.1f}{_median(r.get('load_s')):>9.1f}"
                )
        for name, why in part.get("skipped", {}).items():
            lines.append(f"  skipped {name}: {why}")
    return lines


def table(results: dict[str, Any]) -> str:
    lines: list[str] = []
    lines += _persistence_lines(results)
    concurrency = results.get("concurrency", {})
    if concurrency.get("counts"):
        lines.append(
            f"\nConcurrency ({concurrency['calls_per_run']} model calls per run, "
            f"{concurrency['latency_s'] * 1e3:.0f} ms latency; {concurrency['mix']})"
        )
        lines.append(
            f"{'runs':>7}{'wall s':>9}{'x ideal':>9}{'CPU ms/call':>13}"
            f"{'lock errors':>13}{'complete':>10}"
        )
        for runs, fig in concurrency["counts"].items():
            lines.append(
                f"{runs:>7}{_median(fig['wall_s']):>9.2f}"
                f"{_median(fig['wall_over_ideal']):>9.2f}"
                f"{_median(fig['cpu_ms_per_model_call']):>13.3f}"
                f"{fig['lock_errors']:>13}{str(fig['all_complete']):>10}"
            )
    resume = results.get("resume", {})
    if resume.get("cases"):
        lines.append("\nResume (ms, median)")
        lines.append(
            f"{'session':<8}{'messages':>9}{'bounds':>7}{'open':>8}{'load':>8}"
            f"{'1st req':>9}{'total':>8}"
        )
        for name, case in resume["cases"].items():
            lines.append(
                f"{name:<8}{case['messages']:>9}{case['compactions']:>7}"
                f"{_median(case['open_s']) * 1e3:>8.1f}{_median(case['load_s']) * 1e3:>8.1f}"
                f"{_median(case['to_first_request_s']) * 1e3:>9.1f}"
                f"{_median(case['resume_total_s']) * 1e3:>8.1f}"
            )
        ratio = resume["ratio_long_to_short"]
        lines.append("long/short: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()))
    compaction = results.get("compaction", {})
    if compaction:
        lines.append(
            f"\nCompaction: {compaction.get('status', 'see results.json')}"
            + (f" ({compaction['reason']})" if "reason" in compaction else "")
        )
        for name, fig in compaction.get("strategies", {}).items():
            lines.append(f"  {name}: {fig.get('summary', '')}")
    cache = results.get("cache", {})
    if cache.get("variants"):
        lines.append(f"\nPrompt cache (~{cache['turns']} agent turns)")
        for name, fig in cache["variants"].items():
            lines.append(
                f"  {name:<24} {fig['read_share']:>7.1%} read from cache, est. ${fig['cost']:.4f}"
            )
    elif cache:
        lines.append(f"\nPrompt cache: {cache.get('status')} ({cache.get('reason', '')})")
    lines.append("\nGoals")
    for item in results.get("goals", []):
        lines.append(
            f"  [{'met' if item['met'] else 'MISSED'}] {item['goal']}: "
            f"{item['value']} (target {item['target']})"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    settings = plan(args.quick)
    sections = args.only.split(",") if args.only else list(SECTIONS)
    results: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": common.machine_info(),
        "packages": common.package_versions(),
        "load_average_start": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory(prefix="anabranch-bench-") as tmp:
        folder = Path(tmp)
        results["disk_commit_s"] = common.fsync_probe(folder)
        for section in sections:
            log(f"[{section}]")
            started = time.perf_counter()
            results[section] = await RUNNERS[section](folder, settings.get(section, {}))
            results[section]["seconds"] = round(time.perf_counter() - started, 1)
    results["load_average_end"] = os.getloadavg()
    results["goals"] = goals(results)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description="anabranch benchmarks")
    parser.add_argument("--quick", action="store_true", help="smaller run (< 3 minutes)")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results.json"))
    args = parser.parse_args()
    started = time.perf_counter()
    results = asyncio.run(main_async(args))
    results["seconds"] = round(time.perf_counter() - started, 1)
    Path(args.out).write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")
    print(table(results))
    print(f"\n{results['mode']} run in {results['seconds']} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
