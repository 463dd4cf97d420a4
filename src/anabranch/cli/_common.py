"""What every command module shares: the one-line error, ``--db`` and registration."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Coroutine
from typing import Any

import pydantic

from anabranch.errors import ApprovalPendingError, UserError
from anabranch.models._base import Model
from anabranch.runtime._loader import load_object, split_reference
from anabranch.runtime._report import SessionSummary
from anabranch.runtime._runtime import DEFAULT_DB

OFFLINE_MODEL = "OFFLINE_MODEL"
"""A module-level name a definition file may bind to the model ``--offline`` should use."""

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


class CliError(Exception):
    """A one-line error for the user."""


def default_db() -> str:
    return os.environ.get("ANABRANCH_DB", DEFAULT_DB)


def add_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    handler: Handler,
    help_text: str,
) -> argparse.ArgumentParser:
    """Register a sub-command that takes ``--db``; every command module uses this."""
    sub = commands.add_parser(name, help=help_text, description=help_text)
    sub.add_argument(
        "--db",
        default=default_db(),
        help="SQLite file or postgresql:// DSN (default $ANABRANCH_DB or anabranch.db)",
    )
    sub.set_defaults(handler=handler)
    return sub


def offline_model(args: argparse.Namespace, source: str | None = None) -> Model | None:
    """``None`` (the real API) unless ``--offline``: then the file's ``OFFLINE_MODEL`` or a
    plain ``TestModel``."""
    if not getattr(args, "offline", False):
        return None
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
    if isinstance(output, pydantic.BaseModel):
        return output.model_dump_json(indent=2)
    return str(output)
