"""``anabranch testing serve`` and ``python -m anabranch.testing``: the local Messages API
server from the command line."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

import anyio

__all__ = ["add_serve_command", "cmd_serve", "main", "register", "serve"]


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--context-limit", type=int, default=200_000)
    parser.add_argument("--min-cache-tokens", type=int, default=1024)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--fault-rate", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=1, help="TestModel tool-call rounds")
    parser.add_argument("--rpm", type=int, default=None, help="limit requests per period")
    parser.add_argument("--itpm", type=int, default=None, help="limit input tokens per period")
    parser.add_argument("--otpm", type=int, default=None, help="limit output tokens per period")
    parser.add_argument("--rate-period", type=float, default=60.0, help="of the limits (60 s)")


def add_serve_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``serve``: prints ``PORT=<n>`` first, then serves until SIGINT/SIGTERM.

    Sets the ``handler`` default to the async ``cmd_serve`` (run it with
    ``anyio.run(args.handler, args)``) and ``func`` to the blocking ``serve``.
    """
    parser = subparsers.add_parser(
        "serve",
        help="serve a local Anthropic Messages API answered by TestModel",
        description="Serve a local Anthropic Messages API (TestModel answers). "
        "The first line of stdout is PORT=<n>.",
    )
    _add_arguments(parser)
    parser.set_defaults(handler=cmd_serve, func=serve)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``testing`` command group (``anabranch testing serve``) to a CLI."""
    testing = commands.add_parser("testing", help="local test servers")
    add_serve_command(testing.add_subparsers(dest="testing_command", required=True))


async def cmd_serve(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM (async handler); returns the exit status."""
    from pydantic import ValidationError

    from anabranch.models._rate import CallRate
    from anabranch.testing._models import TestModel
    from anabranch.testing._server import MessagesServer

    rate = None
    if (args.rpm, args.itpm, args.otpm) != (None, None, None):
        try:
            rate = CallRate(
                requests=args.rpm,
                input_tokens=args.itpm,
                output_tokens=args.otpm,
                period=args.rate_period,
            )
        except ValidationError as exc:
            problem = exc.errors()[0]
            print(f"bad rate limit ({problem['loc'][0]}): {problem['msg']}", file=sys.stderr)
            return 2
    server = MessagesServer(
        policy=TestModel(rounds=args.rounds),
        host=args.host,
        port=args.port,
        context_limit=args.context_limit,
        min_cache_tokens=args.min_cache_tokens,
        latency_ms=args.latency_ms,
        fault_rate=args.fault_rate,
        seed=args.seed,
        rate_limits=rate,
    )
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with server:
            print(f"PORT={server.port}", flush=True)
            print(f"serving the Messages API at {server.base_url}", file=sys.stderr, flush=True)
            async for _ in signals:
                break
    return 0


def serve(args: argparse.Namespace) -> int:
    """Blocking: serve until SIGINT or SIGTERM. Returns the exit status."""
    return anyio.run(cmd_serve, args)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m anabranch.testing [options]``."""
    parser = argparse.ArgumentParser(prog="python -m anabranch.testing")
    _add_arguments(parser)
    raise SystemExit(serve(parser.parse_args(argv)))
