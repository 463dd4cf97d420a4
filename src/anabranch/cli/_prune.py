"""``anabranch delete ID...`` and ``anabranch prune``: remove sessions from a database.

The store is insert-only while sessions run; these commands are the one way to remove one,
all its runs, messages, calls, snapshots, spills and search index entries in one
transaction. A session a live process is driving is never removed.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from anabranch.cli._common import CliError, add_command, check_db

if TYPE_CHECKING:
    from anabranch.store.sqlite import SQLiteStore

__all__ = ["register"]

STATUSES = ("done", "failed", "interrupted")


async def _open(db: str) -> SQLiteStore:
    from anabranch.store import SQLiteStore

    check_db(db)
    return await SQLiteStore.open(db, create=False)


async def cmd_delete(args: argparse.Namespace) -> int:
    from anabranch.errors import SessionNotFoundError

    store = await _open(args.db)
    try:
        missing = [i for i in args.session_ids if await store.get_session(i) is None]
        if missing:
            raise SessionNotFoundError(missing[0])
        for session_id in args.session_ids:
            await store.delete_session(session_id)
            print(f"deleted {session_id}")
    finally:
        await store.close()
    return 0


async def cmd_prune(args: argparse.Namespace) -> int:
    from anabranch.runtime._report import session_status

    if not args.status and args.older_than is None:
        raise CliError("say what to prune: --status STATUS and/or --older-than DAYS")
    if args.older_than is not None and args.older_than < 0:
        raise CliError("--older-than must be a number of days >= 0")
    cutoff = time.time() - args.older_than * 86_400 if args.older_than is not None else None
    store = await _open(args.db)
    chosen = []
    try:
        for session in await store.list_sessions(limit=1_000_000):
            status = await session_status(store, session)
            if status == "running":
                continue  # a live process is driving it
            if args.status and status not in args.status:
                continue
            if cutoff is not None and session.created >= cutoff:
                continue
            chosen.append((session.id, status))
        for session_id, status in chosen:
            if not args.dry_run:
                await store.delete_session(session_id)
            print(f"{'would delete' if args.dry_run else 'deleted'} {session_id} ({status})")
    finally:
        await store.close()
    if not chosen:
        print("nothing to prune")
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``delete`` and ``prune`` to the ``anabranch`` command."""
    delete = add_command(
        commands, "delete", cmd_delete, "Delete sessions (and everything recorded in them)."
    )
    delete.add_argument("session_ids", metavar="ID", nargs="+")
    prune = add_command(
        commands,
        "prune",
        cmd_prune,
        "Delete the sessions that match: by status and/or age (never a running one).",
    )
    prune.add_argument(
        "--status",
        action="append",
        choices=STATUSES,
        help="delete sessions with this status (repeatable), e.g. --status interrupted",
    )
    prune.add_argument(
        "--older-than", type=float, metavar="DAYS", help="delete sessions created before that"
    )
    prune.add_argument("--dry-run", action="store_true", help="only list what would be deleted")
