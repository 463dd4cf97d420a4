"""What every command module shares: the one-line error, ``--db`` and registration."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Coroutine
from typing import Any

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
