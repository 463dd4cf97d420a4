"""``anabranch chat``: a conversation with an agent, one session across turns.

Reads turns from stdin when it is not a terminal (one answer per turn on stdout). On a
terminal it shows the context gauge before each prompt and understands ``/compact``,
``/context``, ``/cost`` and ``/quit``. ``--session ID`` continues a conversation, also one
whose process was killed mid-turn (that turn is finished first).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, TextIO

import anyio

from anabranch.cli._common import CliError, add_command, offline_model, output_text

if TYPE_CHECKING:  # the engine is imported when the command runs (a fast ``--help``)
    from anabranch.agents import Agent
    from anabranch.runtime._runtime import Runtime
    from anabranch.runtime._session_view import ContextGauge

__all__ = ["register"]

COMMANDS = "/compact  /context  /cost  /quit"


def _k(tokens: int) -> str:
    return f"{tokens / 1000:.1f}k" if tokens >= 1000 else str(tokens)


def gauge_text(gauge: ContextGauge) -> str:
    """``[context 12.3k / 64k]``, the prompt's gauge."""
    window = f"{gauge.window // 1000}k" if gauge.window % 1000 == 0 else _k(gauge.window)
    return f"[context {_k(gauge.tokens)} / {window}]"


class Chat:
    """One chat: the runtime, the agent and (once the first turn ran) the session."""

    def __init__(
        self, rt: Runtime, agent: Agent, session_id: str | None, source: str, out: TextIO
    ) -> None:
        self.rt = rt
        self.agent = agent
        self.session_id = session_id
        self.source = source
        self.out = out

    async def turn(self, text: str) -> str:
        if self.session_id is None:

            def announce(session_id: str) -> None:
                self.session_id = session_id
                print(f"session {session_id}", file=sys.stderr, flush=True)

            result = await self.rt.run(self.agent, text, source=self.source, on_session=announce)
        else:
            result = await self.rt.send(self.session_id, text, agent=self.agent)
        return output_text(result.raise_for_status().output)

    async def finish_interrupted(self) -> str | None:
        """A turn a killed process left unanswered is answered now (None: there was none)."""
        if self.session_id is None:
            return None
        session = await self.rt.store.get_session(self.session_id)
        if session is None:
            raise CliError(f"no session {self.session_id!r} in {self.rt.db}")
        if session.entry != self.agent.name:
            raise CliError(
                f"session {self.session_id} talks to agent {session.entry!r}, "
                f"not {self.agent.name!r}"
            )
        runs = await self.rt.store.list_runs(self.session_id)
        root = next((r for r in runs if r.parent_run_id is None and r.task_id is None), None)
        if root is not None and root.status != "running":
            return None
        result = await self.rt.resume(self.session_id, self.agent)
        return output_text(result.raise_for_status().output)

    async def gauge(self) -> ContextGauge | None:
        from anabranch.runtime._session_view import context_gauge

        if self.session_id is None:
            return None
        return await context_gauge(self.rt.store, self.session_id, self.agent)

    async def command(self, line: str) -> bool:
        """Run a ``/`` command; False when the chat should end."""
        name = line.split()[0].lower()
        if name in ("/quit", "/exit"):
            return False
        if self.session_id is None:
            print("(nothing yet: say something first)", file=self.out)
            return True
        if name == "/compact":
            outcome = await self.rt.compact(self.session_id, self.agent)
            boundary = (
                await self.rt.store.get_boundary(outcome.boundary_id)
                if outcome.boundary_id is not None
                else None
            )
            if outcome.applied and boundary is not None:
                print(
                    f"compacted: {_k(boundary.tokens_before or 0)} → "
                    f"{_k(boundary.tokens_after or 0)} tokens (boundary #{boundary.id})",
                    file=self.out,
                )
            else:
                print(f"not compacted: {outcome.failure or 'nothing to compact'}", file=self.out)
        elif name == "/context":
            gauge = await self.gauge()
            if gauge is not None:
                print(
                    f"{gauge_text(gauge)} threshold {_k(gauge.threshold)}, "
                    f"{gauge.messages} messages, {gauge.compactions} compactions, "
                    f"run {gauge.run_id}",
                    file=self.out,
                )
        elif name == "/cost":
            from anabranch.context._pricing import PriceTable
            from anabranch.runtime._report import session_tree, tree_totals

            roots = await session_tree(self.rt.store, self.session_id, PriceTable())
            totals = tree_totals(roots)
            usage = totals.usage
            print(
                f"${totals.cost.total:.4f} so far; in={_k(usage.total_input_tokens)} "
                f"(cache read {totals.read_ratio:.0%}) out={_k(usage.output_tokens)}",
                file=self.out,
            )
        else:
            print(f"unknown command {name}; try {COMMANDS}", file=self.out)
        return True


async def _read_line(prompt: str) -> str | None:
    def read() -> str | None:
        try:
            return input(prompt)
        except EOFError:
            return None

    return await anyio.to_thread.run_sync(read)


async def cmd_chat(args: argparse.Namespace) -> int:
    from anabranch.agents import Agent
    from anabranch.cli._progress import ProgressLines
    from anabranch.runtime._loader import load_object, split_reference
    from anabranch.runtime._runtime import Runtime

    obj = load_object(args.target)
    if not isinstance(obj, Agent):
        raise CliError(f"{args.target} is a {type(obj).__name__}, not an Agent")
    path, name = split_reference(args.target)
    source = f"{path}:{name}"
    interactive = sys.stdin.isatty()
    on_event: Any = None if args.quiet or interactive else ProgressLines(sys.stderr)
    rt = Runtime(
        db=args.db,
        model=offline_model(args, source),
        tracer_provider=args.tracer_provider,
        on_event=on_event,
    )
    await rt.open(create=args.session is None)
    try:
        chat = Chat(rt, obj, args.session, source, sys.stdout)
        pending = await chat.finish_interrupted()
        if pending is not None:
            print(pending, flush=True)
        if interactive:
            print(f"chatting with {obj.name}; {COMMANDS}", file=sys.stderr)
        while True:
            prompt = ""
            if interactive:
                gauge = await chat.gauge()
                prompt = (gauge_text(gauge) + " " if gauge else "") + "> "
            line = await _read_line(prompt)
            if line is None:
                break
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                if not await chat.command(text):
                    break
                continue
            print(await chat.turn(text), flush=True)
    finally:
        await rt.aclose()
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``chat`` to the ``anabranch`` command."""
    from anabranch.cli._tracing import add_trace_arguments

    chat = add_command(
        commands,
        "chat",
        cmd_chat,
        "Talk to an agent, turn by turn, in one session (reads stdin when it is not a TTY).",
    )
    chat.add_argument("target", metavar="FILE:OBJ", help="Python file and the Agent in it")
    chat.add_argument("--session", metavar="ID", help="continue this conversation")
    chat.add_argument("--offline", action="store_true", help="Use the built-in TestModel")
    chat.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_trace_arguments(chat)
