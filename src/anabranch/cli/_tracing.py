"""The CLI's tracing: the ``--otlp``/``--trace-file``/``--trace`` flags, and finding the
Phoenix that ``anabranch ui`` started (``anabranch.traces.configure`` does the SDK setup)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from anabranch.errors import UserError

if TYPE_CHECKING:  # the OpenTelemetry SDK is imported only by a command that traces
    from anabranch.traces.configure import PhoenixEndpoint, TraceSetup

__all__ = ["add_trace_arguments", "configure_from_args", "find_phoenix"]


def find_phoenix() -> PhoenixEndpoint:
    """``PHOENIX_COLLECTOR_ENDPOINT``'s Phoenix, else the one ``anabranch ui`` started.

    Raises:
        UserError: neither is there.
    """
    from anabranch.traces.configure import PhoenixEndpoint, phoenix_from_env
    from anabranch.ui._phoenix import running_phoenix

    endpoint = phoenix_from_env()
    if endpoint is not None:
        return endpoint
    info = running_phoenix()
    if info is None:
        raise UserError(
            "--trace phoenix: no Phoenix is running; start one with `anabranch ui` "
            "(or set PHOENIX_COLLECTOR_ENDPOINT)"
        )
    return PhoenixEndpoint(info.otlp_endpoint, info.url)


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """``--otlp``, ``--trace-file`` and ``--trace`` for commands that run sessions."""
    group = parser.add_argument_group(
        "tracing", "OpenTelemetry spans; the standard OTEL_* variables are honoured too"
    )
    group.add_argument(
        "--otlp",
        metavar="URL",
        help="send spans over OTLP/HTTP (protobuf); a base URL gets /v1/traces",
    )
    group.add_argument(
        "--trace-file",
        metavar="PATH",
        type=Path,
        help="append spans to PATH as OTLP-JSON lines (one span per line)",
    )
    group.add_argument(
        "--trace",
        choices=["phoenix"],
        help="send spans to the Phoenix started by `anabranch ui`",
    )


def configure_from_args(args: argparse.Namespace) -> TraceSetup | None:
    """The setup for a parsed command line; None for commands without tracing flags."""
    if not hasattr(args, "trace_file"):
        return None
    from anabranch.traces.configure import TraceSettings, configure

    return configure(
        TraceSettings(
            otlp=args.otlp,
            trace_file=args.trace_file,
            phoenix=find_phoenix() if args.trace == "phoenix" else None,
        )
    )
