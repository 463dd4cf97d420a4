"""``anabranch report ID -o report.html``: one self-contained page (inline SVG and CSS, no
script, no network) that shows what every agent of a session saw and paid.

- the run tree: tokens, cache-read share and cost per sub-agent and rolled up;
- each agent's context size over its calls against its window and threshold, compaction
  drops marked (the sawtooth);
- the cache-read share of every call over time, cache breaks marked;
- the compaction table, with whatever the store recorded about each (loss manifests).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Sequence
from html import escape
from typing import Any

from anabranch.runtime._views import CallView, CompactionView, RunView, SessionView

__all__ = ["CONTEXT_COLOUR", "render_report"]

CONTEXT_COLOUR = "#d9480f"
"""The context-size line (a test looks for it in the screenshot)."""
CACHE_COLOUR = "#1971c2"
WIDTH, HEIGHT, PAD = 760, 220, 44

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#212529;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}
table{border-collapse:collapse;font-size:12.5px}
th,td{border-bottom:1px solid #dee2e6;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f1f3f5}td.l,th.l{text-align:left}
.muted{color:#868e96}.bad{color:#c92a2a}
svg{background:#f8f9fa;border:1px solid #dee2e6;margin:6px 0 14px}
svg text{font:11px system-ui,sans-serif;fill:#495057}
.plots{display:flex;flex-wrap:wrap;gap:12px}
"""


def _k(n: float | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1000:.1f}k" if abs(n) >= 1000 else f"{n:.0f}"


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return dt.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def _walk(runs: Sequence[RunView], depth: int = 0) -> Iterator[tuple[int, RunView]]:
    for run in runs:
        yield depth, run
        yield from _walk(run.children, depth + 1)


def _tree_table(view: SessionView) -> str:
    head = (
        "<tr><th class=l>agent</th><th class=l>run</th><th>status</th><th>turns</th>"
        "<th>input</th><th>output</th><th>cache read</th><th>cost</th><th>compactions</th>"
        "<th>rolled-up input</th><th>rolled-up cache read</th><th>rolled-up cost</th></tr>"
    )
    rows = []
    for depth, run in _walk(view.runs):
        name = ("&nbsp;&nbsp;&nbsp;" * depth) + ("└ " if depth else "") + escape(run.agent)
        up = run.rolled_up
        rows.append(
            f"<tr class=run-row data-run='{escape(run.id)}'><td class=l>{name}</td>"
            f"<td class='l muted'>{escape(run.id)}</td><td>{escape(run.status)}</td>"
            f"<td>{run.turns}</td><td>{_k(run.usage.total_input_tokens)}</td>"
            f"<td>{_k(run.usage.output_tokens)}</td><td>{run.cache_read_share:.0%}</td>"
            f"<td>${run.cost:.4f}</td><td>{run.compactions}</td>"
            f"<td>{_k(up.usage.total_input_tokens)}</td><td>{up.cache_read_share:.0%}</td>"
            f"<td>${up.cost:.4f}</td></tr>"
        )
    return f"<table class=run-tree>{head}{''.join(rows)}</table>"


def _scale(value: float, low: float, high: float, out_low: float, out_high: float) -> float:
    if high <= low:
        return (out_low + out_high) / 2
    return out_low + (value - low) * (out_high - out_low) / (high - low)


def _context_plot(run: RunView) -> str:
    calls = run.calls
    if not calls:
        return ""
    top = max([c.context_tokens for c in calls] + [run.window or 0]) * 1.05 or 1.0
    right, bottom = WIDTH - PAD / 2, HEIGHT - PAD / 2

    def x(i: int) -> float:
        return _scale(i, 0, max(len(calls) - 1, 1), PAD, right)

    def y(tokens: float) -> float:
        return _scale(tokens, 0, top, bottom, PAD / 2)

    parts = [
        f"<svg class=context-plot data-run='{escape(run.id)}' width={WIDTH} height={HEIGHT} "
        f"viewBox='0 0 {WIDTH} {HEIGHT}' xmlns='http://www.w3.org/2000/svg'>",
        f"<text x={PAD} y=14>{escape(run.agent)} {escape(run.id)}: context tokens per call</text>",
        f"<line x1={PAD} y1={bottom} x2={right} y2={bottom} stroke='#adb5bd'/>",
        f"<text x=4 y={bottom}>0</text><text x=4 y={y(top / 1.05) + 4:.1f}>{_k(top / 1.05)}</text>",
    ]
    limits = (("window", run.window, "#495057"), ("threshold", run.threshold, "#e67700"))
    for name, value, colour in limits:
        if value:
            parts.append(
                f"<line class={name} x1={PAD} y1={y(value):.1f} x2={right} y2={y(value):.1f} "
                f"stroke='{colour}' stroke-dasharray='6 4'/>"
                f"<text x={right - 120} y={y(value) - 4:.1f}>{name} {_k(value)}</text>"
            )
    points = " ".join(f"{x(i):.1f},{y(c.context_tokens):.1f}" for i, c in enumerate(calls))
    parts.append(
        f"<polyline class=context-line points='{points}' fill='none' stroke='{CONTEXT_COLOUR}' "
        "stroke-width='2.5'/>"
    )
    for i, call in enumerate(calls):
        if i and call.compactions_before > calls[i - 1].compactions_before:
            parts.append(
                f"<line class=compaction-drop x1={x(i):.1f} y1={PAD / 2} x2={x(i):.1f} "
                f"y2={bottom} stroke='#7048e8' stroke-width='1.5'>"
                f"<title>compaction before call {call.id}</title></line>"
            )
    parts.append(f"<text x={PAD} y={HEIGHT - 6}>calls 1..{len(calls)}; purple: compaction</text>")
    parts.append("</svg>")
    return "".join(parts)


def _cache_plot(calls: Sequence[tuple[RunView, CallView]]) -> str:
    if not calls:
        return ""
    first, last = calls[0][1].created, calls[-1][1].created
    right, bottom = WIDTH - PAD / 2, HEIGHT - PAD / 2

    def x(t: float) -> float:
        return _scale(t, first, last, PAD, right)

    def y(share: float) -> float:
        return _scale(share, 0, 1, bottom, PAD / 2)

    parts = [
        f"<svg class=cache-plot width={WIDTH} height={HEIGHT} viewBox='0 0 {WIDTH} {HEIGHT}' "
        "xmlns='http://www.w3.org/2000/svg'>",
        f"<text x={PAD} y=14>cache-read share of each call over time (all agents)</text>",
        f"<line x1={PAD} y1={bottom} x2={right} y2={bottom} stroke='#adb5bd'/>",
        f"<text x=4 y={bottom}>0%</text><text x=4 y={PAD / 2 + 4}>100%</text>",
    ]
    for run, call in calls:
        colour = "#c92a2a" if call.cache_break else CACHE_COLOUR
        kind = "cache-break" if call.cache_break else "cache-point"
        title = f"{run.agent} call {call.id}: {call.cache_read_share:.0%}"
        if call.cache_break:
            title += f" CACHE BREAK ({call.cache_break})"
            parts.append(
                f"<line x1={x(call.created):.1f} y1={PAD / 2} x2={x(call.created):.1f} "
                f"y2={bottom} stroke='#ffa8a8'/>"
            )
        parts.append(
            f"<circle class={kind} cx={x(call.created):.1f} cy={y(call.cache_read_share):.1f} "
            f"r=3.5 fill='{colour}'><title>{escape(title)}</title></circle>"
        )
    parts.append(f"<text x={PAD} y={HEIGHT - 6}>red: cache break</text></svg>")
    return "".join(parts)


def _compaction_table(compactions: Sequence[CompactionView]) -> str:
    if not compactions:
        return "<p class=muted>No compactions.</p>"
    extra_keys = sorted(
        {k for c in compactions for k in c.details if k not in ("next_seq", "usage")}
    )
    head = "".join(
        f"<th class=l>{escape(h)}</th>"
        for h in ("#", "agent", "run", "kind", "trigger", "strategy", "status")
    )
    head += "<th>tokens</th><th>messages</th><th>seconds</th>"
    head += "".join(f"<th class=l>{escape(k)}</th>" for k in extra_keys)
    rows = []
    for c in compactions:
        cells = [
            str(c.id),
            c.agent or "?",
            c.run_id,
            c.kind,
            c.trigger or "-",
            c.strategy or "-",
            c.status + (f": {c.error}" if c.error else ""),
        ]
        row = "".join(f"<td class=l>{escape(v)}</td>" for v in cells)
        row += f"<td>{_k(c.tokens_before)} → {_k(c.tokens_after)}</td>"
        row += f"<td>{c.messages_before if c.messages_before is not None else '-'} → "
        row += f"{c.messages_after if c.messages_after is not None else '-'}</td>"
        row += f"<td>{c.duration:.2f}</td>" if c.duration is not None else "<td>-</td>"
        for key in extra_keys:
            value: Any = c.details.get(key)
            text = value if isinstance(value, str) else json.dumps(value)
            row += f"<td class=l>{escape(text[:300]) if value is not None else ''}</td>"
        rows.append(f"<tr class=compaction-row>{row}</tr>")
    return f"<table class=compactions><tr>{head}</tr>{''.join(rows)}</table>"


def render_report(view: SessionView) -> str:
    """The whole report as one HTML document."""
    all_calls = sorted(
        ((run, call) for _, run in _walk(view.runs) for call in run.calls),
        key=lambda pair: pair[1].created,
    )
    breaks = sum(1 for _, c in all_calls if c.cache_break)
    plots = "".join(_context_plot(run) for _, run in _walk(view.runs))
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>anabranch report {escape(view.id)}</title><style>{_CSS}</style></head><body>"
        f"<h1>Session {escape(view.id)}</h1>"
        f"<p>{escape(view.kind)} <b>{escape(view.entry)}</b> · {escape(view.status)} · "
        f"started {_when(view.created)}<br><span class=muted>{escape(view.task[:400])}</span></p>"
        f"<p>input {_k(view.usage.total_input_tokens)} tokens "
        f"({view.cache_read_share:.1%} read from cache) · output "
        f"{_k(view.usage.output_tokens)} · estimated cost ${view.cost:.4f} · "
        f"{len(all_calls)} calls · {breaks} cache breaks · "
        f"{sum(1 for c in view.compactions if c.kind == 'compaction' and c.status == 'ok')} "
        "compactions</p>"
        "<h2>Run tree: per agent and rolled up</h2>"
        f"{_tree_table(view)}"
        "<h2>Context size per agent (window, threshold, compactions)</h2>"
        f"<div class=plots>{plots}</div>"
        "<h2>Cache reads over time</h2>"
        f"{_cache_plot(all_calls)}"
        "<h2>Compactions</h2>"
        f"{_compaction_table(view.compactions)}"
        "</body></html>"
    )
