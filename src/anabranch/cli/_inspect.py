"""Looking into a session: ``show --messages`` / ``--json``, ``report`` (HTML) and
``approve`` (answer a pending tool approval)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

import anyio

from anabranch.cli._common import CliError, add_command
from anabranch.errors import SessionNotFoundError

if TYPE_CHECKING:  # the engine is imported when the command runs (a fast ``--help``)
    from anabranch.context._pricing import PriceTable
    from anabranch.runtime._runtime import Runtime
    from anabranch.store import RunRecord, SessionRecord, Store

__all__ = ["print_messages", "print_session_json", "register"]


async def print_session_json(store: Store, session: SessionRecord, prices: PriceTable) -> None:
    """``show --json``: the session view (docs/json.md)."""
    from anabranch.runtime._views import session_view

    view = await session_view(store, session, prices)
    print(view.model_dump_json(indent=2))


async def print_messages(
    store: Store, session: SessionRecord, run: RunRecord | None, as_json: bool
) -> None:
    """``show --messages [RUN]``: the run's transcript (the root run by default)."""
    from anabranch.runtime._transcript import render_transcript, run_transcript

    runs = await store.list_runs(session.id)
    if run is None:
        run = next((r for r in runs if r.parent_run_id is None), None)
    if run is None:
        raise CliError(f"session {session.id} has no runs yet")
    entries = await run_transcript(store, run.id)
    if as_json:
        payload = {
            "schema_version": 1,
            "session_id": session.id,
            "run_id": run.id,
            "agent": run.agent_name,
            "entries": [e.model_dump(mode="json") for e in entries],
        }
        print(json.dumps(payload, indent=2))
        return
    print(f"run {run.id} ({run.agent_name}, {run.status}) of session {session.id}")
    print(render_transcript(entries))
    others = [r for r in runs if r.id != run.id]
    if others:
        print(f"({len(others)} other runs: anabranch show {session.id} --messages RUN_ID)")


async def _open(db: str) -> Runtime:
    from anabranch.runtime._runtime import Runtime

    rt = Runtime(db=db)
    await rt.open(create=False)
    return rt


async def cmd_report(args: argparse.Namespace) -> int:
    from anabranch.cli._html_report import render_report
    from anabranch.context._pricing import PriceTable
    from anabranch.runtime._views import session_view

    rt = await _open(args.db)
    try:
        session = await rt.store.get_session(args.session_id)
        if session is None:
            raise SessionNotFoundError(args.session_id)
        view = await session_view(rt.store, session, PriceTable())
    finally:
        await rt.aclose()
    out = anyio.Path(args.output)
    try:
        await out.write_text(render_report(view), encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot write {out}: {exc.strerror or exc}") from exc
    print(f"report written to {await out.absolute()}")
    return 0


async def cmd_approve(args: argparse.Namespace) -> int:
    from anabranch.runtime._approval import pending_approvals

    rt = await _open(args.db)
    try:
        if await rt.store.get_session(args.session_id) is None:
            raise SessionNotFoundError(args.session_id)
        if args.call_id is None:
            pending = await pending_approvals(rt.store, args.session_id)
            if not pending:
                print(f"no tool call is waiting for approval in session {args.session_id}")
            for item in pending:
                arguments = json.dumps(item.arguments, sort_keys=True)
                print(f"{item.call_id}  {item.tool}({arguments[:200]})  run {item.run_id}")
            return 0
        item = await rt.approve(args.session_id, args.call_id, deny=args.deny)
    finally:
        await rt.aclose()
    verdict = "denied" if args.deny is not None else "approved"
    print(
        f"{verdict} {item.tool} call {item.call_id}; "
        f"continue with: anabranch resume {args.session_id}"
    )
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``report`` and ``approve`` to the ``anabranch`` command."""
    report = add_command(
        commands, "report", cmd_report, "Write a self-contained HTML report of a session."
    )
    report.add_argument("session_id", metavar="ID")
    report.add_argument("-o", "--output", default="report.html", help="default %(default)s")
    approve = add_command(
        commands,
        "approve",
        cmd_approve,
        "Answer a tool call waiting for approval (without CALL_ID: list the waiting ones).",
    )
    approve.add_argument("session_id", metavar="ID")
    approve.add_argument("call_id", metavar="CALL_ID", nargs="?")
    approve.add_argument("--deny", metavar="REASON", help="deny it; the model gets the reason")
