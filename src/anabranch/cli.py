"""The ``anabranch`` command: run, resume, list and inspect sessions."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import anyio

from anabranch.agents import Agent
from anabranch.errors import AnabranchError
from anabranch.runtime.loader import load_object, split_reference
from anabranch.runtime.model import Model
from anabranch.runtime.report import RunNode, list_sessions, session_tree
from anabranch.runtime.runtime import DEFAULT_DB, Runtime

__all__ = ["main"]

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


class CliError(Exception):
    """A one-line error for the user."""


def _default_db() -> str:
    return os.environ.get("ANABRANCH_DB", DEFAULT_DB)


def _model(args: argparse.Namespace) -> Model | None:
    if getattr(args, "offline", False):
        from anabranch.testing import TestModel

        return TestModel()
    return None


def _tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 10_000 else str(n)


def _when(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def _load_definition(reference: str) -> Any:
    obj = load_object(reference)
    if not isinstance(obj, Agent):
        raise CliError(f"{reference} is a {type(obj).__name__}, not an Agent")
    return obj


async def cmd_run(args: argparse.Namespace) -> int:
    definition = _load_definition(args.target)
    path, name = split_reference(args.target)
    source = f"{path}:{name}"

    def announce(session_id: str) -> None:
        print(f"session {session_id}", file=sys.stderr, flush=True)

    async with Runtime(db=args.db, model=_model(args)) as rt:
        result = await rt.run(definition, args.task, source=source, on_session=announce)
    print(result.output)
    return 0


async def cmd_resume(args: argparse.Namespace) -> int:
    rt = Runtime(db=args.db, model=_model(args))
    await rt.open(create=False)
    try:
        result = await rt.resume(args.session_id)
    finally:
        await rt.aclose()
    if result.status != "done":
        raise CliError(f"session {result.session_id} failed: {result.error}")
    print(result.output)
    return 0


async def cmd_sessions(args: argparse.Namespace) -> int:
    rt = Runtime(db=args.db)
    await rt.open(create=False)
    try:
        summaries = await list_sessions(rt.store, limit=args.limit)
    finally:
        await rt.aclose()
    if not summaries:
        print("no sessions")
        return 0
    print(f"{'ID':<22} {'STATUS':<12} {'CREATED':<19} {'AGENTS':>6} {'TOKENS':>9}  ENTRY")
    unfinished = []
    for s in summaries:
        tokens = s.usage.total_input_tokens + s.usage.output_tokens
        print(
            f"{s.session.id:<22} {s.status:<12} {_when(s.session.created):<19} "
            f"{s.agents:>6} {_tokens(tokens):>9}  {s.session.entry}"
        )
        if s.status == "interrupted":
            unfinished.append(s.session.id)
    if unfinished:
        print(
            "\nresume an interrupted session with: anabranch resume <ID>  (e.g. "
            f"anabranch resume {unfinished[0]})"
        )
    return 0


def _print_node(node: RunNode, indent: str, last: bool, root: bool) -> None:
    run = node.run
    usage = node.usage
    branch = "" if root else ("└─ " if last else "├─ ")
    label = f"{run.agent_name} [{run.status}]"
    if run.task_id:
        label = f"{run.task_id}: {label}"
    stats = (
        f"turns={node.turns} in={_tokens(usage.total_input_tokens)} "
        f"(cache read {_tokens(usage.cache_read_input_tokens)}, "
        f"write {_tokens(usage.cache_creation_input_tokens)}) "
        f"out={_tokens(usage.output_tokens)} compactions={node.compactions}"
    )
    if node.failed_attempts:
        stats += f" failed_attempts={node.failed_attempts}"
    print(f"{indent}{branch}{label} {run.id}  {stats}")
    child_indent = indent if root else indent + ("   " if last else "│  ")
    for i, child in enumerate(node.children):
        _print_node(child, child_indent, i == len(node.children) - 1, False)


async def cmd_show(args: argparse.Namespace) -> int:
    rt = Runtime(db=args.db)
    await rt.open(create=False)
    try:
        session = await rt.store.get_session(args.session_id)
        if session is None:
            raise CliError(f"no session with id {args.session_id!r} in {args.db}")
        roots = await session_tree(rt.store, session.id)
        usage = await rt.session_usage(session.id)
    finally:
        await rt.aclose()
    print(f"session {session.id}  status={session.status}  created={_when(session.created)}")
    print(f"task: {session.task}")
    for root in roots:
        _print_node(root, "", True, True)
    print(
        f"total: in={usage.total_input_tokens} (uncached {usage.input_tokens}, "
        f"cache read {usage.cache_read_input_tokens}, "
        f"cache write {usage.cache_creation_input_tokens}) out={usage.output_tokens}"
    )
    if session.output:
        print(f"output: {session.output}")
    return 0


def add_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    handler: Handler,
    help_text: str,
) -> argparse.ArgumentParser:
    """Register a sub-command that takes ``--db``; feature modules use this too."""
    sub = commands.add_parser(name, help=help_text, description=help_text)
    sub.add_argument("--db", default=_default_db(), help="SQLite file (default %(default)s)")
    sub.set_defaults(handler=handler)
    return sub


EXTENSIONS: list[str] = ["anabranch.testing.cli"]
"""Modules with a ``register(commands)`` function that add their own sub-commands."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="anabranch", description="Run multi-agent sessions with isolated, persisted contexts."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    run = add_command(commands, "run", cmd_run, "Run an agent on a task in a new session.")
    run.add_argument("target", metavar="FILE:OBJ", help="Python file and the Agent in it")
    run.add_argument("task", help="The task text")
    run.add_argument("--offline", action="store_true", help="Use the built-in TestModel")

    resume = add_command(commands, "resume", cmd_resume, "Continue a session by its id.")
    resume.add_argument("session_id", metavar="ID")
    resume.add_argument("--offline", action="store_true", help="Use the built-in TestModel")

    sessions = add_command(commands, "sessions", cmd_sessions, "List sessions, newest first.")
    sessions.add_argument("--limit", type=int, default=50)

    show = add_command(
        commands, "show", cmd_show, "Show a session's run tree with turns and token usage."
    )
    show.add_argument("session_id", metavar="ID")

    for module_name in EXTENSIONS:
        importlib.import_module(module_name).register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``anabranch`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return anyio.run(handler, args)
    except KeyboardInterrupt:
        print("anabranch: interrupted; resume with: anabranch resume <ID>", file=sys.stderr)
        return 130
    except (AnabranchError, CliError) as exc:
        message = " ".join(str(exc).split())
        print(f"anabranch: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
