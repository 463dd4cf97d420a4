"""CLI commands for compaction: ``anabranch compactions ID`` and ``anabranch rewind``."""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace
from typing import TYPE_CHECKING

from anabranch.cli._common import CliError, add_command, open_store
from anabranch.errors import SessionNotFoundError

if TYPE_CHECKING:  # the engine is imported when the command runs (a fast ``--help``)
    from anabranch.store import BoundaryRecord

__all__ = ["register"]


def _outcome(boundary: BoundaryRecord) -> str:
    from anabranch.runtime._history import boundary_extra

    extra = boundary_extra(boundary)
    if boundary.kind == "breaker":
        return f"breaker open ({extra.get('failures')} failures; policy {extra.get('policy')})"
    if boundary.kind == "rewind":
        return f"rewound to before #{extra.get('rewound')}"
    if boundary.kind == "pin":
        return f"pinned: {extra.get('label')} (recall id={extra.get('handle')})"
    if boundary.status != "ok":
        return f"failed: {' '.join((boundary.error or '').split())[:120]}"
    notes = [n for n in ("ineffective", "degraded") if extra.get(n)]
    return "ok" + (f" ({', '.join(notes)})" if notes else "")


def _manifest_lines(boundary: BoundaryRecord, full: bool) -> list[str]:
    """The loss manifest of an ``ok`` compaction, as indented lines (see context.digest)."""
    from anabranch.context._digest import handle_ranges
    from anabranch.runtime._history import boundary_extra

    extra = boundary_extra(boundary)
    found = extra.get("manifest")
    if boundary.kind != "compaction" or boundary.status != "ok" or not isinstance(found, dict):
        return []
    removed = [int(s) for s in found.get("removed_messages", [])]
    missing = [str(t) for t in found.get("missing", [])]
    inferred = [str(t) for t in found.get("inferred", [])]
    handles = [str(h) for h in found.get("handles", [])]
    shown = 8 if not full else len(missing)
    lines = [
        f"      removed {len(removed)} messages ({', '.join(handle_ranges(removed)) or '-'}), "
        f"{len(found.get('tool_calls', []))} tool calls, {len(handles)} output handles"
    ]
    if missing:
        more = f" (+{len(missing) - shown} more; --full lists all)" if len(missing) > shown else ""
        lines.append(
            f"      not in the summary: {len(missing)} terms: {', '.join(missing[:shown])}{more}"
        )
    else:
        lines.append("      not in the summary: nothing (every identifier, number and path kept)")
    if inferred:
        lines.append(f"      inferred (found nowhere in the range): {len(inferred)} lines")
        lines.extend(f"        - {line[:160]}" for line in inferred[: None if full else 3])
    pins = extra.get("pins")
    if isinstance(pins, dict):
        attached, over = pins.get("attached") or [], pins.get("over_cap") or []
        lines.append(f"      pins re-attached: {len(attached)}, over the caps (named): {len(over)}")
    if full and handles:
        lines.append("      handles: " + ", ".join(handles))
    return lines


def _tokens(before: int | None, after: int | None) -> str:
    if before is None:
        return "-"
    return f"{before}→{after}" if after is not None else f"{before}→-"


async def cmd_compactions(args: argparse.Namespace) -> int:
    from anabranch.runtime._views import compaction_views

    async with open_store(args.db, read_only=True) as store:  # never migrates or writes
        rt = SimpleNamespace(store=store)
        session = await rt.store.get_session(args.session_id)
        if session is None:
            raise SessionNotFoundError(args.session_id)
        runs = {r.id: r for r in await rt.store.list_runs(session.id)}
        boundaries = await rt.store.list_boundaries(session_id=session.id)
        views = await compaction_views(rt.store, session.id) if args.json else []
    if args.json:
        print(json.dumps([v.model_dump(mode="json") for v in views], indent=2))
        return 0
    if not boundaries:
        print(f"no compactions in session {session.id}")
        return 0
    print(
        f"{'#':>4} {'AGENT':<16} {'RUN':<20} {'KIND':<10} {'TRIGGER':<9} {'STRATEGY':<9} "
        f"{'TOKENS':>13} {'MESSAGES':>9} {'SECONDS':>7}  OUTCOME"
    )
    for b in boundaries:
        run = runs.get(b.run_id)
        messages = (
            f"{b.messages_before}→{b.messages_after if b.messages_after is not None else '-'}"
            if b.messages_before is not None
            else "-"
        )
        seconds = f"{b.duration:.2f}" if b.duration is not None else "-"
        print(
            f"{b.id:>4} {(run.agent_name if run else '?'):<16} {b.run_id:<20} {b.kind:<10} "
            f"{b.trigger or '-':<9} {b.strategy or '-':<9} "
            f"{_tokens(b.tokens_before, b.tokens_after):>13} {messages:>9} {seconds:>7}  "
            f"{_outcome(b)}"
        )
        for line in _manifest_lines(b, args.full):
            print(line)
    return 0


async def cmd_rewind(args: argparse.Namespace) -> int:
    from anabranch.runtime._runtime import Runtime

    rt = Runtime(db=args.db)
    await rt.open(create=False)
    try:
        if await rt.store.get_session(args.session_id) is None:
            raise SessionNotFoundError(args.session_id)
        try:
            record = await rt.rewind(args.session_id, args.run_id, args.boundary_id)
        except ValueError as exc:  # pragma: no cover - argparse already checks the int
            raise CliError(str(exc)) from exc
        run = await rt.store.get_run(args.run_id)
    finally:
        await rt.aclose()
    print(
        f"run {args.run_id} rewound to before boundary #{args.boundary_id}: "
        f"{record.messages_before} → {record.messages_after} messages "
        f"(~{record.tokens_before} → ~{record.tokens_after} tokens); new boundary #{record.id}"
    )
    if run is not None and run.status != "running":
        # resume never reopens a finished run: it would return the stored result
        print(
            f"run {args.run_id} had already {run.status}: the rewound context is kept as "
            f"boundary #{record.id} (anabranch compactions {args.session_id}), but resume "
            "returns the finished result and runs nothing"
        )
    else:
        print(f"continue from there with: anabranch resume {args.session_id}")
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``compactions`` and ``rewind`` to the ``anabranch`` command."""
    compactions = add_command(
        commands,
        "compactions",
        cmd_compactions,
        "List every compaction in a session: agent, trigger, strategy, tokens, outcome, and "
        "its loss manifest (what was removed; what the summary lacks or inferred).",
    )
    compactions.add_argument("session_id", metavar="ID")
    compactions.add_argument("--json", action="store_true", help="machine-readable (docs/json.md)")
    compactions.add_argument(
        "--full",
        action="store_true",
        help="list every term missing from a summary, every inferred line and every handle",
    )
    rewind = add_command(
        commands,
        "rewind",
        cmd_rewind,
        "Restore a run's context to before a compaction, as a new branch.",
    )
    rewind.add_argument("session_id", metavar="SESSION")
    rewind.add_argument("run_id", metavar="RUN")
    rewind.add_argument("boundary_id", metavar="BOUNDARY", type=int)
