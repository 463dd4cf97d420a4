"""``anabranch ui``: start Arize Phoenix locally and offline, print its URL."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import anyio
import anyio.to_thread

from anabranch.ui._phoenix import (
    PhoenixError,
    PhoenixServer,
    clear_state,
    data_home,
    phoenix_env,
    running_phoenix,
    stop_recorded,
    write_state,
)
from anabranch.ui._phoenix_env import PhoenixInstallError, install_phoenix

__all__ = ["cmd_ui", "register"]


async def _wait_until_stopped(server: PhoenixServer) -> None:
    """Until Ctrl-C / SIGTERM, or until Phoenix exits on its own."""
    async with anyio.create_task_group() as group:

        async def on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
                async for _ in received:
                    group.cancel_scope.cancel()
                    return

        group.start_soon(on_signal)
        await anyio.to_thread.run_sync(server.process.wait, abandon_on_cancel=True)
        group.cancel_scope.cancel()


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def cmd_ui(args: argparse.Namespace) -> int:
    if args.install:
        try:
            python = await anyio.to_thread.run_sync(
                lambda: install_phoenix(phoenix_env(), log=_progress)
            )
        except PhoenixInstallError as exc:
            raise PhoenixError(str(exc)) from exc
        print(f"Phoenix is installed in its own environment ({python})")
        return 0
    if args.stop:
        stopped = stop_recorded()
        if stopped is None:
            print("no Phoenix started by `anabranch ui` is running")
        else:
            print(f"stopped Phoenix at {stopped.url} (pid {stopped.pid})")
        return 0
    existing = running_phoenix()
    if existing is not None:
        print(f"Phoenix is already running at {existing.url} (pid {existing.pid})")
        return 0
    server = await anyio.to_thread.run_sync(
        lambda: PhoenixServer.start(
            args.data_dir,
            port=args.port,
            detach=args.background,
            install=not args.no_install,
            on_progress=_progress,
        )
    )
    print(f"starting Phoenix (data in {server.info.working_dir}) ...", file=sys.stderr, flush=True)
    try:
        info = await anyio.to_thread.run_sync(server.wait_ready, args.start_timeout)
    except BaseException:
        server.stop()
        raise
    write_state(info)
    print(f"Phoenix is running at {info.url}", flush=True)
    print(
        'send a session to it:  anabranch run FILE:OBJ "TASK" --trace phoenix\n'
        + (
            "stop it with:  anabranch ui --stop"
            if args.background
            else "stop it with Ctrl-C (or: anabranch ui --stop)"
        ),
        file=sys.stderr,
        flush=True,
    )
    if args.background:
        return 0
    try:
        await _wait_until_stopped(server)
    finally:
        server.stop()
        clear_state(info.pid)
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``ui`` command (a ``cli.EXTENSIONS`` module)."""
    from anabranch.cli._common import add_command

    ui = add_command(
        commands,
        "ui",
        cmd_ui,
        "Start Arize Phoenix locally (offline) to inspect traces, from its own environment "
        "(created on first use under the data dir).",
    )
    ui.add_argument(
        "--port", type=int, default=None, help="HTTP port (default 6006 if free, else any)"
    )
    ui.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"Phoenix's working dir (default {data_home() / 'phoenix'})",
    )
    ui.add_argument("--background", action="store_true", help="Start it, print the URL and return")
    ui.add_argument("--stop", action="store_true", help="Stop the Phoenix started earlier")
    ui.add_argument(
        "--install",
        action="store_true",
        help=f"(Re)create Phoenix's own environment ({phoenix_env()}) and exit",
    )
    ui.add_argument("--no-install", action="store_true", help="Fail instead of installing Phoenix")
    ui.add_argument(
        "--start-timeout", type=float, default=120.0, help="Seconds to wait for it to start"
    )
