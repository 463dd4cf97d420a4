"""The ``anabranch`` command: run, resume, list and inspect sessions."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import pydantic

from anabranch.agents import Agent, Graph
from anabranch.cli import _chat, _compaction, _inspect, _memory, _ui, _workers
from anabranch.cli._budget import add_budget_arguments, budget_lines, stop_label
from anabranch.cli._common import (
    CliError,
    Handler,
    add_command,
    approval_hint,
    offline_model,
    output_text,
    session_json,
)
from anabranch.cli._inspect import print_messages, print_session_json
from anabranch.cli._limits import declared_windows, window_labels
from anabranch.cli._progress import add_progress_arguments, event_printer
from anabranch.cli._tracing import add_trace_arguments, configure_from_args
from anabranch.context._pricing import Cost, PriceTable
from anabranch.errors import AnabranchError, ApprovalPendingError
from anabranch.runtime._history import session_outline, snapshot_blocks
from anabranch.runtime._loader import load_object, split_reference
from anabranch.runtime._report import RunNode, list_sessions, session_tree, tree_totals
from anabranch.runtime._results import RunResult
from anabranch.runtime._runtime import DEFAULT_DB, Runtime
from anabranch.store import RunRecord, SessionRecord, Store, describe_db, open_store
from anabranch.store._dsn import resumable_db
from anabranch.testing import _command as _testing

__all__ = ["main"]


def _tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 10_000 else str(n)


def _when(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def _load_definition(reference: str) -> Any:
    obj = load_object(reference)
    if not isinstance(obj, Agent | Graph):
        raise CliError(f"{reference} is a {type(obj).__name__}, not an Agent or a Graph")
    return obj


async def cmd_run(args: argparse.Namespace) -> int:
    definition = _load_definition(args.target)
    path, name = split_reference(args.target)
    source = f"{path}:{name}"

    def announce(session_id: str) -> None:
        print(f"session {session_id}", file=sys.stderr, flush=True)

    if isinstance(definition, Graph):
        if args.task:
            raise CliError(f"{args.target} is a Graph: its tasks carry their prompts; drop TASK")
        async with Runtime(
            db=args.db,
            model=offline_model(args, source),
            tracer_provider=args.tracer_provider,
            on_event=event_printer(args),
        ) as rt:
            graph_result = await rt.run_graph(
                definition,
                source=source,
                on_session=announce,
                budget=args.budget,
                tenant=args.tenant,
            )
        if not args.events:
            print(graph_result.output)
        graph_result.raise_for_status()
        return 0
    if not args.task:
        raise CliError(f"{args.target} is an Agent: give it a TASK")
    async with Runtime(
        db=args.db,
        model=offline_model(args, source),
        tracer_provider=args.tracer_provider,
        on_event=event_printer(args),
    ) as rt:
        result = await rt.run(
            definition,
            args.task,
            source=source,
            on_session=announce,
            budget=args.budget,
            tenant=args.tenant,
        )
    result.raise_for_status()
    if not args.events:
        print(output_text(result.output))
    _note_incomplete(result)
    return 0


def _note_incomplete(result: RunResult) -> None:
    if result.incomplete:
        print(
            f"incomplete: stopped by a limit ({result.stop_reason}); continue it with "
            f"anabranch resume {result.session_id} --budget ...",
            file=sys.stderr,
        )


async def _session_source(db: str, session_id: str) -> str | None:
    store = await open_store(db, create=False)
    try:
        session = await store.get_session(session_id)
    finally:
        await store.close()
    return session.source if session else None


async def cmd_resume(args: argparse.Namespace) -> int:
    source = await _session_source(args.db, args.session_id) if args.offline else None
    rt = Runtime(
        db=args.db,
        model=offline_model(args, source),
        tracer_provider=args.tracer_provider,
        on_event=event_printer(args),
    )
    await rt.open(create=False)
    try:
        result = await rt.resume(args.session_id, budget=args.budget)
    finally:
        await rt.aclose()
    result.raise_for_status()
    if not args.events:
        print(output_text(result.output))
    _note_incomplete(result)
    return 0


async def cmd_sessions(args: argparse.Namespace) -> int:
    rt = Runtime(db=args.db)
    await rt.open(create=False)
    try:
        summaries = await list_sessions(rt.store, limit=args.limit)
    finally:
        await rt.aclose()
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


def _cost(cost: Cost, unpriced: int) -> str:
    text = f"${cost.total:.4f}"
    return text + (f" (+{unpriced} unpriced calls)" if unpriced else "")


def _print_node(
    node: RunNode,
    indent: str,
    last: bool,
    root: bool,
    calls: bool = False,
    windows: Mapping[str, str] | None = None,
) -> None:
    run = node.run
    usage = node.usage
    branch = "" if root else ("└─ " if last else "├─ ")
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
        + f" cost~{_cost(node.cost, node.unpriced_calls)} "
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
        _print_node(child, child_indent, i == len(node.children) - 1, False, calls, windows)


def _prices(path: str | None) -> PriceTable:
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


async def cmd_show(args: argparse.Namespace) -> int:
    prices = _prices(args.prices)
    rt = Runtime(db=args.db)
    await rt.open(create=False)
    try:
        session = await rt.store.get_session(args.session_id)
        run = None
        if session is None:  # a run id works too
            run = await rt.store.get_run(args.session_id)
            session = await rt.store.get_session(run.session_id) if run else None
        if session is None:
            raise CliError(
                f"no session with id {args.session_id!r} in {describe_db(args.db)} (nor a run)"
            )
        if args.system:
            await _print_snapshots(rt.store, session, run)
            return 0
        if args.messages is not None:
            chosen = run
            if args.messages:
                chosen = await rt.store.get_run(args.messages)
                if chosen is None or chosen.session_id != session.id:
                    raise CliError(f"no run {args.messages!r} in session {session.id}")
            await print_messages(rt.store, session, chosen, args.json)
            return 0
        if args.json:
            await print_session_json(rt.store, session, prices)
            return 0
        roots = await session_tree(rt.store, session.id, prices)
        runs = {r.id: r.agent_name for r in await rt.store.list_runs(session.id)}
        limits = await rt.store.run_context_limits(session.id)
        totals = tree_totals(roots)
        budgets = await budget_lines(rt.store, session, roots, totals)
    finally:
        await rt.aclose()
    windows = window_labels(runs, limits, declared_windows(session))
    usage = totals.usage
    print(f"session {session.id}  status={session.status}  created={_when(session.created)}")
    print(f"task: {session.task}")
    for root in roots:
        _print_node(root, "", True, True, args.calls, windows)
    if session.kind == "graph" and session.definition:
        ran = {root.run.task_id for root in roots}
        for task in session_outline(session).get("tasks", []):
            if task["id"] not in ran:
                print(f"{task['id']}: {task['agent']} [not run]")
    print(
        f"total: in={usage.total_input_tokens} (uncached {usage.input_tokens}, "
        f"cache read {usage.cache_read_input_tokens}, "
        f"cache write {usage.cache_creation_input_tokens}) out={usage.output_tokens}"
    )
    causes: dict[str, int] = {}
    for found in totals.cache_breaks:
        causes[found.cause] = causes.get(found.cause, 0) + 1
    print(
        f"cache: {totals.read_ratio:.1%} of input tokens read from cache; "
        f"estimated cost {_cost(totals.cost, totals.unpriced_calls)}; cache breaks: "
        + (", ".join(f"{cause} x{n}" for cause, n in sorted(causes.items())) or "none")
    )
    for line in budgets:
        print(line)
    if session.output:
        print(f"output: {session.output}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="anabranch", description="Run multi-agent sessions with isolated, persisted contexts."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    run = add_command(
        commands, "run", cmd_run, "Run an agent on a task (or a task graph) in a new session."
    )
    run.add_argument("target", metavar="FILE:OBJ", help="Python file and the Agent or Graph in it")
    run.add_argument("task", nargs="?", help="The task text (an Agent needs one; a Graph none)")
    run.add_argument("--offline", action="store_true", help="Use the built-in TestModel")
    add_budget_arguments(run, tenant=True)
    add_progress_arguments(run)
    add_trace_arguments(run)

    resume = add_command(commands, "resume", cmd_resume, "Continue a session by its id.")
    resume.add_argument("session_id", metavar="ID")
    resume.add_argument("--offline", action="store_true", help="Use the built-in TestModel")
    add_budget_arguments(resume, tenant=False)
    add_progress_arguments(resume)
    add_trace_arguments(resume)

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

    _testing.register(commands)
    _compaction.register(commands)
    _ui.register(commands)
    _chat.register(commands)
    _inspect.register(commands)
    _memory.register(commands)
    _workers.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``anabranch`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    tracing = None
    try:
        tracing = configure_from_args(args)
        args.tracer_provider = tracing.provider if tracing else None
        return anyio.run(handler, args)
    except KeyboardInterrupt:
        print("anabranch: interrupted; resume with: anabranch resume <ID>", file=sys.stderr)
        return 130
    except ApprovalPendingError as pending:
        print(approval_hint(pending, args.db), file=sys.stderr)
        return 3
    except (AnabranchError, CliError) as exc:
        message = " ".join(str(exc).split())
        print(f"anabranch: error: {message}", file=sys.stderr)
        return 1
    finally:
        if tracing is not None:
            tracing.shutdown()
            for link in tracing.trace_links():
                print(f"trace: {link}", file=sys.stderr)
