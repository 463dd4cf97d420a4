"""``anabranch sessions`` and ``anabranch show``: read-only inspection of a database
(``show --messages``/``--json`` come from ``cli._inspect``)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from anabranch.cli._common import DEFAULT_DB, CliError, add_command, open_store, session_json

if TYPE_CHECKING:
    from anabranch.context._pricing import Cost, PriceTable
    from anabranch.runtime._report import RunNode
    from anabranch.store import RunRecord, SessionRecord, Store

__all__ = ["register"]


def _tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 10_000 else str(n)


def _when(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


async def cmd_sessions(args: argparse.Namespace) -> int:
    from anabranch.runtime._report import list_sessions

    async with open_store(args.db, read_only=True) as store:
        summaries = await list_sessions(store, limit=args.limit)
    if args.json:
        print(json.dumps([session_json(s) for s in summaries], indent=2))
        return 0
    if not summaries:
        print("no sessions")
        return 0
    print(f"{'ID':<22} {'STATUS':<12} {'CREATED':<19} {'AGENTS':>6} {'TOKENS':>9}  ENTRY")
    unfinished, waiting = [], []
    for s in summaries:
        tokens = s.usage.total_input_tokens + s.usage.output_tokens
        print(
            f"{s.session.id:<22} {s.status:<12} {_when(s.session.created):<19} "
            f"{s.agents:>6} {_tokens(tokens):>9}  {s.session.entry}"
        )
        if s.status == "interrupted":
            unfinished.append(s.session.id)
        if s.status == "waiting":
            waiting.append(s.session.id)
    from anabranch.store._dsn import resumable_db

    db = "" if args.db == DEFAULT_DB else f" --db {shlex.quote(resumable_db(args.db))}"
    if unfinished:
        print("\nunfinished sessions; continue each where it stopped with:")
        for session_id in unfinished:
            print(f"  anabranch resume {shlex.quote(session_id)}{db}")
    if waiting:
        print("\nsessions waiting for a tool approval; list and answer them with:")
        for session_id in waiting:
            print(f"  anabranch approve {shlex.quote(session_id)}{db}")
    return 0


def _cost(cost: Cost, unpriced: int, priced: bool = True) -> str:
    text = f"${cost.total:.4f}"
    if not priced:
        text += " (test model)"
    return text + (f" (+{unpriced} unpriced calls)" if unpriced else "")


def _print_node(
    node: RunNode,
    indent: str,
    last: bool,
    root: bool,
    calls: bool = False,
    priced: bool = True,
    windows: Mapping[str, str] | None = None,
) -> None:
    run = node.run
    usage = node.usage
    branch = "" if root else ("└─ " if last else "├─ ")
    from anabranch.cli._budget import stop_label

    label = f"{run.agent_name} {stop_label(run.status, run.error)}"
    if run.mode == "fork":
        label += " (fork)"
    if run.task_id:
        label = f"{run.task_id}: {label}"
    stats = (
        f"turns={node.turns} in={_tokens(usage.total_input_tokens)} "
        f"(uncached {_tokens(usage.input_tokens)}, "
        f"cache read {_tokens(usage.cache_read_input_tokens)} = {node.read_ratio:.0%}, "
        f"write {_tokens(usage.cache_creation_input_tokens)}) "
        f"out={_tokens(usage.output_tokens)}"
        + (f" (thinking {_tokens(usage.thinking_tokens)})" if usage.thinking_tokens else "")
        + f" cost~{_cost(node.cost, node.unpriced_calls, priced)} "
        f"compactions={node.compactions}"
    )
    if node.failed_attempts:
        stats += f" failed_attempts={node.failed_attempts}"
    if node.cache_breaks:
        stats += f" cache_breaks={len(node.cache_breaks)}"
    if windows and run.id in windows:
        stats += f" {windows[run.id]}"
    print(f"{indent}{branch}{label} {run.id}  {stats}")
    child_indent = indent if root else indent + ("   " if last else "│  ")
    inner = child_indent + ("│  " if node.children else "   ")
    for item in node.calls if calls else ():
        u = item.usage
        line = (
            f"{inner}call {item.call.id} turn {item.call.turn}: "
            f"uncached {u.input_tokens}, read {u.cache_read_input_tokens} "
            f"({item.read_ratio:.0%}), write {u.cache_creation_input_tokens}, "
            f"out {u.output_tokens}"
            + (f" (thinking {u.thinking_tokens})" if u.thinking_tokens else "")
            + ", cost~"
            + (f"${item.cost.total:.4f}" if item.cost is not None else "unpriced")
        )
        if item.cache_break is not None:
            line += f"  CACHE BREAK: {item.cache_break.cause}"
        print(line)
    for found in node.cache_breaks if not calls else ():
        print(
            f"{inner}cache break at call {found.call_id}: {found.cause} "
            f"(read {found.actual_read} of {found.expected_read} tokens)"
        )
    for i, child in enumerate(node.children):
        _print_node(child, child_indent, i == len(node.children) - 1, False, calls, priced, windows)


def _prices(path: str | None) -> PriceTable:
    import pydantic

    from anabranch.context._pricing import PriceTable

    if path is None:
        return PriceTable()
    try:
        return PriceTable.from_json(
            path if path.lstrip().startswith("{") else os.path.abspath(path)
        )
    except (OSError, pydantic.ValidationError) as exc:
        message = " ".join(str(exc).split())
        raise CliError(f"cannot use prices from {path}: {message}") from exc


async def _print_snapshots(store: Store, session: SessionRecord, run: RunRecord | None) -> None:
    from anabranch.runtime._history import snapshot_blocks

    runs = [run] if run is not None else await store.list_runs(session.id)
    shown = runs if run is not None else [r for r in runs if r.parent_run_id is None][:1]
    for record in shown:
        snapshot = await store.latest_snapshot(record.id)
        if snapshot is None:
            print(f"run {record.id} ({record.agent_name}) has no system-prompt snapshot")
            continue
        print(
            f"run {record.id} ({record.agent_name})  snapshot v{snapshot.version} "
            f"({snapshot.reason}, {_when(snapshot.created)})"
        )
        blocks, tools = snapshot_blocks(snapshot)
        for index, block in enumerate(blocks):
            kind = "static" if index == 0 and len(blocks) > 1 else "dynamic" if index else "system"
            print(f"--- system block {index + 1} ({kind}) ---")
            print(block.text)
        print(f"--- tools ({len(tools)}): {', '.join(t.name for t in tools) or 'none'}")
    others = len(runs) - len(shown)
    if others:
        print(f"({others} more runs in this session: anabranch show RUN_ID --system)")


def _outline(session: SessionRecord) -> dict[str, Any]:
    from anabranch.runtime._history import session_outline

    return session_outline(session)


def _priced(session: SessionRecord) -> bool:
    """False for a session run on a test model: its dollar figures are labelled as such."""
    return not str(_outline(session).get("model_client", "")).startswith("anabranch.testing")


def _unrun_tasks(
    session: SessionRecord, status: str, ran: Mapping[str, str]
) -> list[tuple[str, str, str]]:
    """(task, agent, label) of a graph's tasks that have no run, labelled as the API's
    ``GraphResult`` reports them: failed when a dependency failed, else cancelled (or
    pending while the session can still be resumed)."""
    found: dict[str, str] = dict(ran)
    rows = []
    for task in _outline(session).get("tasks", []):
        if task["id"] in ran:
            continue
        failed = [d for d in task.get("depends_on", []) if found.get(d) == "failed"]
        if failed:
            label = f"failed: not run, dependency {failed[0]!r} failed"
            found[task["id"]] = "failed"
        elif status == "interrupted":
            label = "pending"
        else:
            label = "cancelled: not run"
        rows.append((task["id"], task["agent"], label))
    return rows


async def cmd_show(args: argparse.Namespace) -> int:
    from anabranch.cli._budget import budget_lines
    from anabranch.cli._limits import declared_windows, window_labels
    from anabranch.runtime._report import session_status, session_tree, tree_totals
    from anabranch.store import describe_db

    prices = _prices(args.prices)
    async with open_store(args.db, read_only=True) as store:
        session = await store.get_session(args.session_id)
        run = None
        if session is None:  # a run id works too
            run = await store.get_run(args.session_id)
            session = await store.get_session(run.session_id) if run else None
        if session is None:
            raise CliError(
                f"no session with id {args.session_id!r} in {describe_db(args.db)} (nor a run)"
            )
        if args.system:
            await _print_snapshots(store, session, run)
            return 0
        if args.messages is not None:
            from anabranch.cli._inspect import print_messages

            chosen = run
            if args.messages:
                chosen = await store.get_run(args.messages)
                if chosen is None or chosen.session_id != session.id:
                    raise CliError(f"no run {args.messages!r} in session {session.id}")
            await print_messages(store, session, chosen, args.json)
            return 0
        if args.json:
            from anabranch.cli._inspect import print_session_json

            await print_session_json(store, session, prices)
            return 0
        roots = await session_tree(store, session.id, prices)
        status = await session_status(store, session)
        totals = tree_totals(roots)
        budgets = await budget_lines(store, session, roots, totals)
        runs = {r.id: r.agent_name for r in await store.list_runs(session.id)}
        limits = await store.run_context_limits(session.id)
    windows = window_labels(runs, limits, declared_windows(session))
    priced = _priced(session)
    usage = totals.usage
    print(f"session {session.id}  status={status}  created={_when(session.created)}")
    print(f"task: {session.task}")
    for root in roots:
        _print_node(root, "", True, True, args.calls, priced, windows)
    if session.kind == "graph":
        ran = {root.run.task_id: root.run.status for root in roots if root.run.task_id}
        for task_id, agent, label in _unrun_tasks(session, status, ran):
            print(f"{task_id}: {agent} [{label}]")
    print(
        f"total: in={usage.total_input_tokens} (uncached {usage.input_tokens}, "
        f"cache read {usage.cache_read_input_tokens}, "
        f"cache write {usage.cache_creation_input_tokens}) out={usage.output_tokens}"
    )
    causes: dict[str, int] = {}
    for found in totals.cache_breaks:
        causes[found.cause] = causes.get(found.cause, 0) + 1
    cost = f"estimated cost {_cost(totals.cost, totals.unpriced_calls)}" + (
        "" if priced else ", as if a test model's tokens were paid for: not real dollars"
    )
    print(
        f"cache: {totals.read_ratio:.1%} of input tokens read from cache; {cost}; cache breaks: "
        + (", ".join(f"{cause} x{n}" for cause, n in sorted(causes.items())) or "none")
    )
    for line in budgets:
        print(line)
    if session.output:
        print(f"output: {session.output}")
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``sessions`` and ``show`` to the ``anabranch`` command."""
    sessions = add_command(commands, "sessions", cmd_sessions, "List sessions, newest first.")
    sessions.add_argument("--json", action="store_true", help="machine-readable (docs/json.md)")
    sessions.add_argument("--limit", type=int, default=50)

    show = add_command(
        commands,
        "show",
        cmd_show,
        "Show a session's run tree with turns, token usage, cache accounting and cost.",
    )
    show.add_argument("session_id", metavar="ID", help="a session id (or a run id)")
    show.add_argument("--calls", action="store_true", help="one line per model call")
    show.add_argument(
        "--system", action="store_true", help="print the run's system-prompt snapshot"
    )
    show.add_argument("--prices", metavar="FILE", help="JSON price overrides per model")
    show.add_argument(
        "--messages",
        nargs="?",
        const="",
        metavar="RUN",
        help="print what the run's model was shown, turn by turn (default: the root run)",
    )
    show.add_argument("--json", action="store_true", help="machine-readable (docs/json.md)")
