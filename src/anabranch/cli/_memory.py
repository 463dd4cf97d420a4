"""``anabranch memory list|show NAME|search QUERY|consolidate DIR``: the memory folder."""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

import anyio.to_thread

from anabranch.cli._common import CliError

if TYPE_CHECKING:  # the memory package is imported when a command runs (a fast ``--help``)
    from anabranch.memory import MemoryFolder

__all__ = ["register"]


def _default_dir() -> str:
    return os.environ.get("ANABRANCH_MEMORY", "memory")


def _folder(args: argparse.Namespace) -> MemoryFolder:
    from anabranch.memory import MemoryFolder

    root = Path(args.dir).expanduser()
    if not root.is_dir():
        raise CliError(f"{root} is not a memory folder (no such directory)")
    return MemoryFolder(root)


async def cmd_list(args: argparse.Namespace) -> int:
    memories = await anyio.to_thread.run_sync(_folder(args).all)
    if not memories:
        print(f"no memories in {args.dir}")
        return 0
    print(f"{'NAME':<32} {'TYPE':<10} {'UPDATED':<26} DESCRIPTION")
    for m in memories:
        print(f"{m.name:<32} {m.type:<10} {m.updated:<26} {m.description}")
    return 0


async def cmd_show(args: argparse.Namespace) -> int:
    from anabranch.memory import MemoryWriteError

    folder = _folder(args)
    try:
        memory = await anyio.to_thread.run_sync(folder.read, args.name)
    except MemoryWriteError as exc:
        raise CliError(str(exc)) from exc
    if memory is None:
        raise CliError(f"no memory named {args.name!r} in {folder.root}")
    print(memory.render(), end="")
    return 0


async def cmd_search(args: argparse.Namespace) -> int:
    from anabranch.memory._select import keyword_selection

    memories = await anyio.to_thread.run_sync(_folder(args).all)
    names = keyword_selection(args.query, memories, args.limit)
    if not names:
        print(f"no memory matches {args.query!r}")
        return 0
    by_name = {m.name: m for m in memories}
    for name in names:
        print(f"{name} ({by_name[name].type}): {by_name[name].description}")
    return 0


def _root(folder: str) -> Path:
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise CliError(f"{root} is not a memory folder (no such directory)")
    return root


async def cmd_consolidate(args: argparse.Namespace) -> int:
    from anabranch.memory import consolidate, consolidate_with_model

    root = _root(args.folder)
    if args.retention_days is not None and args.retention_days <= 0:
        raise CliError("--retention-days must be a positive number of days")
    if args.model is None:
        report = await anyio.to_thread.run_sync(
            functools.partial(consolidate, root, retention_days=args.retention_days)
        )
    else:
        from anabranch.models import AnthropicModel

        model = AnthropicModel()
        try:
            report = await consolidate_with_model(
                root, model=model, model_name=args.model, retention_days=args.retention_days
            )
        finally:
            await model.aclose()
    print(report.summary())
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    memory = commands.add_parser(
        "memory",
        help="List, show, search and consolidate a long-term memory folder.",
        description="List, show, search and consolidate a long-term memory folder.",
    )
    verbs = memory.add_subparsers(dest="memory_command", required=True)

    def verb(name: str, handler: object, help_text: str) -> argparse.ArgumentParser:
        sub = verbs.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        if name != "consolidate":
            sub.add_argument(
                "--dir", default=_default_dir(), help="memory folder (default %(default)s)"
            )
        return sub

    verb("list", cmd_list, "List the memories, most recently updated first.")
    verb("show", cmd_show, "Print one memory file.").add_argument("name", metavar="NAME")
    search = verb("search", cmd_search, "Memories sharing the most words with QUERY.")
    search.add_argument("query", metavar="QUERY")
    search.add_argument("--limit", type=int, default=10)
    consolidate_cmd = verb(
        "consolidate",
        cmd_consolidate,
        "Merge overlapping memories (newest wins), distill the daily logs, prune old ones.",
    )
    consolidate_cmd.add_argument("folder", metavar="DIR")
    consolidate_cmd.add_argument(
        "--retention-days", type=int, default=None, help="prune memories older than this"
    )
    consolidate_cmd.add_argument(
        "--model",
        default=os.environ.get("ANABRANCH_CONSOLIDATE_MODEL"),
        help="a model that merges and distills (Anthropic API; ANTHROPIC_API_KEY and "
        "ANTHROPIC_BASE_URL as usual); without it, or when it fails, the deterministic merge",
    )
