"""The ``anabranch`` command: parse, dispatch, and turn every failure into one line.

Only the standard library is imported here; each command imports what it needs when it runs,
so ``--help`` and the read-only commands start fast.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sqlite3
import sys
import traceback
from collections.abc import Sequence

from anabranch.cli import (
    _chat,
    _compaction,
    _inspect,
    _memory,
    _prune,
    _run,
    _sessions,
    _ui,
    _workers,
)
from anabranch.cli._common import DEFAULT_DB, CliError, Handler, Started
from anabranch.cli._tracing import configure_from_args
from anabranch.testing import _command as _testing

__all__ = ["build_parser", "main"]

DEBUG_ENV = "ANABRANCH_DEBUG"
"""Set to 1 for the traceback of an unexpected error (as ``--debug``)."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("anabranch")
    except PackageNotFoundError:
        from anabranch._version import VERSION

        return VERSION


class _Version(argparse.Action):
    """``--version`` without importing the package's engine."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        print(f"anabranch {_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="anabranch", description="Run multi-agent sessions with isolated, persisted contexts."
    )
    parser.add_argument("--version", action=_Version)
    parser.add_argument(
        "--debug", action="store_true", help=f"tracebacks for unexpected errors (or {DEBUG_ENV}=1)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    _run.register(commands)
    _sessions.register(commands)
    _prune.register(commands)
    _testing.register(commands)
    _compaction.register(commands)
    _ui.register(commands)
    _chat.register(commands)
    _inspect.register(commands)
    _memory.register(commands)
    _workers.register(commands)
    return parser


def _leaf(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _describe(exc: BaseException, db: str | None) -> str:
    """One line naming the cause of an error that is not one of ours."""
    from anabranch.errors import AnabranchError

    if isinstance(exc, AnabranchError | CliError):
        return _one_line(str(exc))
    if isinstance(exc, sqlite3.Error):
        from anabranch.store import describe_db

        database = f"database {describe_db(db)}" if db else "the database"
        return _one_line(f"{database}: {exc}")
    if isinstance(exc, OSError) and exc.strerror:
        where = str(exc.filename) if exc.filename is not None else db
        return _one_line(f"{where}: {exc.strerror}" if where else str(exc.strerror))
    return _one_line(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


def _resume_hint(started: Started, db: str | None) -> str:
    if started.session_id is None:
        return "anabranch: interrupted before a session was created"
    from anabranch.store._dsn import resumable_db

    flag = "" if db in (None, DEFAULT_DB) else f" --db {shlex.quote(resumable_db(str(db)))}"
    return (
        f"anabranch: interrupted; resume with: anabranch resume "
        f"{shlex.quote(started.session_id)}{flag}"
    )


def _quiet_stdout() -> None:
    """After a closed pipe (``| head``): send what is still buffered nowhere."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``anabranch`` command.

    Every failure is one line on stderr and a non-zero exit: 1 for an error, 130 for Ctrl-C,
    141 when the reader of stdout went away (``anabranch show ID | head``; nothing printed).
    ``--debug`` or ``ANABRANCH_DEBUG=1`` prints the traceback of an unexpected error.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    args.started = Started()
    db = getattr(args, "db", None)
    debug = bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    tracing = None
    try:
        import anyio

        tracing = configure_from_args(args)
        args.tracer_provider = tracing.provider if tracing else None
        return anyio.run(handler, args)
    except BrokenPipeError:
        _quiet_stdout()
        return 141
    except KeyboardInterrupt:
        print(_resume_hint(args.started, db), file=sys.stderr)
        return 130
    except BaseException as raised:
        exc = _leaf(raised)
        from anabranch.errors import ApprovalPendingError

        if isinstance(exc, ApprovalPendingError):
            from anabranch.cli._common import approval_hint

            print(approval_hint(exc, str(db)), file=sys.stderr)
            return 3
        if isinstance(exc, BrokenPipeError):
            _quiet_stdout()
            return 141
        if isinstance(exc, KeyboardInterrupt):
            print(_resume_hint(args.started, db), file=sys.stderr)
            return 130
        if isinstance(exc, SystemExit):
            raise
        if debug:
            traceback.print_exception(exc, file=sys.stderr)
        from anabranch.errors import AnabranchError

        expected = isinstance(exc, AnabranchError | CliError)
        hint = "" if expected or debug else f" (--debug or {DEBUG_ENV}=1 shows the traceback)"
        print(f"anabranch: error: {_describe(exc, db)}{hint}", file=sys.stderr)
        return 1
    finally:
        if tracing is not None:
            tracing.shutdown()
            for link in tracing.trace_links():
                print(f"trace: {link}", file=sys.stderr)
