"""Progress of a running session for the CLI: JSON-lines events, one-line notes on stderr,
or (on a terminal) a live tree of runs (``cli/_live.py``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, TextIO

from anabranch import events as ev

__all__ = ["ProgressLines", "event_printer"]


def _k(tokens: int | None) -> str:
    if tokens is None:
        return "-"
    return f"{tokens / 1000:.1f}k" if tokens >= 1000 else str(tokens)


class ProgressLines:
    """One line per notable event: runs starting and finishing, spawns, compactions
    (tokens before → after), retries with their cause, cache breaks."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def _line(self, event: ev.Event, text: str) -> None:
        who = event.agent or "session"
        run = f" {event.run_id}" if event.run_id else ""
        print(f"[{who}{run}] {text}", file=self._out, flush=True)

    def __call__(self, event: Any) -> None:
        text = self.describe(event)
        if text is not None:
            self._line(event, text)

    @staticmethod
    def describe(event: Any) -> str | None:
        """The line for ``event``, or None if it is not notable."""
        if isinstance(event, ev.RunStarted):
            resumed = f", resumed at turn {event.turns}" if event.turns else ""
            return f"started (depth {event.depth}, window {_k(event.window)}{resumed})"
        if isinstance(event, ev.RunFinished):
            detail = f": {event.error}" if event.error else ""
            return f"{event.status} after {event.turns} turns{detail}"
        if isinstance(event, ev.ChildSpawned):
            return f"spawned {event.child_agent} ({event.mode}) as {event.child_run_id}"
        if isinstance(event, ev.ChildReported):
            return f"{event.child_agent} {event.child_run_id} reported ({event.status})"
        if isinstance(event, ev.CompactionFinished):
            outcome = "" if event.status == "ok" else f" {event.status}: {event.error}"
            return (
                f"{event.boundary_kind} ({event.strategy}, {event.trigger}): "
                f"{_k(event.tokens_before)} → {_k(event.tokens_after)} tokens, "
                f"{event.messages_before} → {event.messages_after} messages{outcome}"
            )
        if isinstance(event, ev.Retry):
            return (
                f"retry after attempt {event.attempt} in {event.delay:.1f}s: "
                f"{event.error_type}: {' '.join(event.error.split())[:160]}"
            )
        if isinstance(event, ev.CacheBreakEvent):
            return (
                f"cache break ({event.cause}): read {event.actual_read} of "
                f"{event.expected_read} tokens"
            )
        if isinstance(event, ev.ApprovalRequested):
            return f"waiting for approval of {event.tool} (call {event.call_id})"
        return None


def event_printer(
    args: argparse.Namespace, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> Callable[[Any], None] | None:
    """The ``on_event`` callback for ``--events`` / progress / ``--quiet`` (None: none)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    sinks: list[Callable[[Any], None]] = []
    if getattr(args, "events", False):

        def json_line(event: Any) -> None:
            out.write(event.model_dump_json() + "\n")
            out.flush()

        sinks.append(json_line)
    if not getattr(args, "quiet", False):
        if err.isatty():
            from anabranch.cli._live import LiveTree

            sinks.append(LiveTree(err))
        else:
            sinks.append(ProgressLines(err))
    if not sinks:
        return None

    def each(event: Any) -> None:
        for sink in sinks:
            sink(event)

    return each
