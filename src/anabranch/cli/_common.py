"""What every command module shares: the one-line error, ``--db``, tracing flags and
registration. Imports only the standard library at module level, so ``--help`` is fast."""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from anabranch.errors import ApprovalPendingError
    from anabranch.models._base import Model
    from anabranch.runtime._report import SessionSummary
    from anabranch.store import Store

OFFLINE_MODEL = "OFFLINE_MODEL"
"""A module-level name a definition file may bind to the model ``--offline`` should use."""

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]

DEFAULT_DB = "anabranch.db"
"""The database when neither ``--db`` nor ``$ANABRANCH_DB`` is given (as the Runtime's)."""


class CliError(Exception):
    """A one-line error for the user."""


@dataclass
class Started:
    """The session a command is driving, once known (for the Ctrl-C message)."""

    session_id: str | None = None


def default_db() -> str:
    return os.environ.get("ANABRANCH_DB", DEFAULT_DB)


def check_db(db: str) -> None:
    """Refuse what cannot hold a session (``:memory:``, a URI) before anything happens."""
    from anabranch.runtime._dbpath import database_path
    from anabranch.store import is_postgres_url

    if not is_postgres_url(db):
        database_path(db)


@asynccontextmanager
async def open_store(db: str, *, read_only: bool) -> AsyncIterator[Store]:
    """The existing database at ``db`` (never created here); ``read_only`` never writes a
    SQLite file (PostgreSQL is opened as it is: reading it writes nothing)."""
    from anabranch.store import SQLiteStore, is_postgres_url
    from anabranch.store import open_store as open_any

    check_db(db)
    if is_postgres_url(db):
        store: Store = await open_any(db, create=False)
    else:
        store = await SQLiteStore.open(db, create=False, read_only=read_only)
    try:
        yield store
    finally:
        await store.close()


def add_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    handler: Handler,
    help_text: str,
) -> argparse.ArgumentParser:
    """Register a sub-command that takes ``--db`` and ``--debug``; every command module uses
    this."""
    sub = commands.add_parser(name, help=help_text, description=help_text)
    sub.add_argument(
        "--db",
        default=default_db(),
        help="SQLite file or postgresql:// DSN (default $ANABRANCH_DB or anabranch.db)",
    )
    sub.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print the traceback of an unexpected error (or set ANABRANCH_DEBUG=1)",
    )
    sub.set_defaults(handler=handler)
    return sub


def offline_model(args: argparse.Namespace, source: str | None = None) -> Model | None:
    """``None`` (the real API) unless ``--offline``: then the file's ``OFFLINE_MODEL`` or a
    plain ``TestModel``."""
    if not getattr(args, "offline", False):
        return None
    from anabranch.errors import UserError
    from anabranch.models._base import Model
    from anabranch.runtime._loader import load_object, split_reference

    if source:
        path, _ = split_reference(source)
        try:
            declared = load_object(f"{path}:{OFFLINE_MODEL}")
        except UserError:
            declared = None
        if isinstance(declared, Model):
            return declared
    from anabranch.testing import TestModel

    return TestModel()


def session_json(summary: SessionSummary) -> dict[str, Any]:
    """One session of ``sessions --json`` (docs/json.md)."""
    session = summary.session
    return {
        "id": session.id,
        "status": summary.status,
        "kind": session.kind,
        "entry": session.entry,
        "task": session.task,
        "created": session.created,
        "finished": session.finished,
        "agents": summary.agents,
        "usage": summary.usage.model_dump(mode="json"),
    }


def approval_hint(pending: ApprovalPendingError, db: str) -> str:
    """What to do about a session paused for approval (the CLI's message)."""
    session = pending.session_id or "<ID>"
    flag = "" if db == DEFAULT_DB else f" --db {db}"
    lines = [f"anabranch: session {session} waits for approval of:"]
    for run_id, call_id, tool in pending.calls:
        lines.append(f"  {tool} (call {call_id}, run {run_id})")
    lines.append(
        f"answer each with: anabranch approve {session} CALL_ID [--deny REASON]{flag}; "
        f"then: anabranch resume {session}{flag}"
    )
    return "\n".join(lines)


def output_text(output: object) -> str:
    """A run's answer as printed: a structured answer as indented JSON."""
    import pydantic

    if isinstance(output, pydantic.BaseModel):
        return output.model_dump_json(indent=2)
    return str(output)


def add_progress_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quiet", action="store_true", help="no progress on stderr (only the answer)"
    )
    parser.add_argument(
        "--events",
        action="store_true",
        help="print every event as one JSON line on stdout (instead of the answer)",
    )
