"""Markdown tables from ``bench/results.json`` (for docs/benchmarks.md).

python bench/report.py [bench/results.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _m(figure: dict[str, float] | None, scale: float = 1.0, digits: int = 2) -> str:
    if not figure:
        return "–"
    return f"{figure['median'] * scale:.{digits}f}"


def _range(figure: dict[str, float] | None, scale: float = 1.0, digits: int = 2) -> str:
    if not figure:
        return "–"
    return (
        f"{figure['median'] * scale:.{digits}f} "
        f"({figure['min'] * scale:.{digits}f}–{figure['max'] * scale:.{digits}f})"
    )


def persistence(results: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for level in ("FULL", "NORMAL"):
        part = results.get("persistence", {}).get(level)
        if not part:
            continue
        out += [
            f"**Persistence, `synchronous={level}`** — median (min–max) over repetitions; "
            "× = ratio of medians to the floor in the same run",
            "",
            "| contender | N | last-10% ms/turn | × floor | total s | bytes/turn | × floor "
            "| full load ms | × floor |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, by_n in part["contenders"].items():
            for n, fig in by_n.items():
                r = fig.get("ratio_to_floor", {})
                out.append(
                    f"| {name} | {n} | {_range(fig['tail_per_turn_s'], 1e3)} "
                    f"| {_m(r.get('tail_per_turn_s'), digits=1)} | {_m(fig['total_s'])} "
                    f"| {_m(fig['bytes_per_turn'], digits=0)} "
                    f"| {_m(r.get('bytes_per_turn'))} | {_range(fig['load_s'], 1e3, 1)} "
                    f"| {_m(r.get('load_s'), digits=1)} |"
                )
        for name, why in part.get("skipped", {}).items():
            out.append(f"\nSkipped `{name}`: {why}.")
        ours = part["contenders"].get("anabranch", {})
        if ours and level == "FULL":
            n = max(ours, key=int)
            tables = ours[n].get("extra", {}).get("table_bytes", {})
            if tables:
                per_turn = ", ".join(
                    f"{name} {size / int(n):.0f}" for name, size in list(tables.items())[:8]
                )
                out.append(f"\nanabranch's bytes per turn by table at N={n}: {per_turn}.")
        out.append("")
    return out


def concurrency(results: dict[str, Any]) -> list[str]:
    part = results.get("concurrency", {})
    if not part.get("counts"):
        return []
    out = [
        f"**Concurrency** — {part['calls_per_run']} model calls per agent run, "
        f"{part['latency_s'] * 1e3:.0f} ms model latency, ideal wall "
        f"{next(iter(part['counts'].values()))['ideal_s']:.1f} s; {part['mix']}",
        "",
        "| agent runs | reps | wall s | × ideal | CPU ms per model call | lock errors "
        "| other errors | every transcript complete |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for runs, fig in part["counts"].items():
        out.append(
            f"| {fig.get('agent_runs', runs)} | {fig['wall_s']['n']} | {_range(fig['wall_s'])} "
            f"| {_m(fig['wall_over_ideal'])} | {_range(fig['cpu_ms_per_model_call'])} "
            f"| {fig['lock_errors']} | {fig['errors'] - fig['lock_errors']} "
            f"| {'yes' if fig['all_complete'] else 'NO'} |"
        )
    return [*out, ""]


def resume(results: dict[str, Any]) -> list[str]:
    part = results.get("resume", {})
    if not part.get("cases"):
        return []
    out = [
        "**Resume** — ms, median (min–max)",
        "",
        "| session | messages | boundaries | messages loaded | DB MB | open | load "
        "| to first request | whole resume |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, case in part["cases"].items():
        out.append(
            f"| {name} | {case['messages']} | {case['compactions']} "
            f"| {case['context_messages']} | {case['db_bytes'] / 1e6:.1f} "
            f"| {_range(case['open_s'], 1e3, 1)} | {_range(case['load_s'], 1e3, 1)} "
            f"| {_range(case['to_first_request_s'], 1e3, 1)} "
            f"| {_range(case['resume_total_s'], 1e3, 1)} |"
        )
    ratio = part["ratio_long_to_short"]
    out.append("")
    out.append(
        "Long / short (medians): "
        + ", ".join(
            f"{key.removesuffix('_s').replace('_', ' ')} {value:.2f}×"
            for key, value in ratio.items()
        )
    )
    return [*out, ""]


def cache(results: dict[str, Any]) -> list[str]:
    part = results.get("cache", {})
    if not part.get("variants"):
        if part:
            return [f"**Prompt cache**: {part.get('status')} ({part.get('reason', '')})", ""]
        return []
    out = [
        f"**Prompt cache** — ~{part['turns']} agent turns, one run (token counts are "
        "deterministic)",
        "",
        "| variant | input tokens | read from cache | cache writes | est. cost $ | cache breaks |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, fig in part["variants"].items():
        breaks = ", ".join(f"{k} {v}" for k, v in fig.get("breaks", {}).items()) or "none"
        out.append(
            f"| {name} | {fig['input_tokens']} | {fig['read_share']:.1%} "
            f"| {fig['cache_write']} | {fig['cost']:.4f} | {breaks} |"
        )
    for note in part.get("notes", []):
        out.append(f"\nNote: {note}.")
    return [*out, ""]


def compaction(results: dict[str, Any]) -> list[str]:
    part = results.get("compaction", {})
    if not part:
        return []
    if part.get("status"):
        return [f"**Compaction**: {part['status']} ({part.get('reason', '')}).", ""]
    out = [
        f"**Compaction** — window {part['window']}, compaction at "
        f"{part['threshold_tokens']} tokens, until {part['k']} compactions; facts planted "
        "every 10th user turn and tool result",
        "",
        "| strategy | turns | compactions | ms per compaction | tokens before | tokens after "
        "| saved | facts | in context | in context or recall |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, fig in part["strategies"].items():
        out.append(
            f"| {name} | {fig['turns']} | {fig['compactions']} "
            f"| {_range(fig['compaction_s'], 1e3, 1)} | {_m(fig['tokens_before'], digits=0)} "
            f"| {_m(fig['tokens_after'], digits=0)} | {fig['share_saved']['median']:.0%} "
            f"| {fig['facts']} | {fig['retention_in_context']:.0%} "
            f"| {fig['retention_with_recall']:.0%} |"
        )
    return [*out, ""]


def goals(results: dict[str, Any]) -> list[str]:
    out = ["**Goals**", "", "| goal | figure | target | |", "|---|---:|---|---|"]
    for item in results.get("goals", []):
        out.append(
            f"| {item['goal']} | {item['value']} | {item['target']} "
            f"| {'met' if item['met'] else '**missed**'} |"
        )
    return [*out, ""]


def markdown(results: dict[str, Any]) -> str:
    machine = results["machine"]
    packages = ", ".join(f"{k} {v}" for k, v in results["packages"].items() if v)
    commit = results.get("disk_commit_s", {})
    head = [
        f"Run: **{results['mode']}**, {results['started']}, {results.get('seconds', '?')} s. "
        f"Machine: {machine.get('cpu_model', '?')}, {machine['cpus']} cores, "
        f"{machine.get('memory_kib', 0) / 2**20:.0f} GiB, Python {machine['python']}, "
        f"SQLite {machine['sqlite']}; load average "
        f"{results['load_average_start'][0]:.1f} at the start, "
        f"{results['load_average_end'][0]:.1f} at the end. One 2.7 kB commit on this disk: "
        f"{commit.get('FULL', 0) * 1e3:.2f} ms at FULL, {commit.get('NORMAL', 0) * 1e3:.3f} ms "
        f"at NORMAL (probe at the start).",
        "",
        f"Packages: {packages}.",
        "",
    ]
    tail = compaction(results)
    return "\n".join(
        head
        + goals(results)
        + persistence(results)
        + concurrency(results)
        + resume(results)
        + tail
        + cache(results)
    )


if __name__ == "__main__":
    source = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).with_name("results.json"))
    print(markdown(json.loads(source.read_text())))
