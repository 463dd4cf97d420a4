"""The model-call rate-limit flags of ``run``, ``resume`` and ``worker``.

``--rpm`` (requests), ``--itpm`` (input tokens: uncached input plus cache writes),
``--otpm`` (output tokens, ``max_tokens`` charged when a call starts) and ``--tpm`` (all
tokens together, as before) per ``--rate-period`` seconds (60). A bad value is one line
before anything starts.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from anabranch.cli._common import CliError

if TYPE_CHECKING:
    from anabranch.models._rate import CallRate

__all__ = ["add_rate_arguments", "call_rate"]

_FLAGS = {
    "requests": "--rpm",
    "input_tokens": "--itpm",
    "output_tokens": "--otpm",
    "tokens": "--tpm",
    "period": "--rate-period",
    "name": "--rate-name",
}


def add_rate_arguments(parser: argparse.ArgumentParser, *, shared_by: str) -> None:
    """Add the rate-limit flags; ``shared_by`` says who shares the limit (for the help).
    Values are checked by ``call_rate`` (one line, no usage dump)."""
    group = parser.add_argument_group(
        "model-call rate limit", f"limits per --rate-period, shared by {shared_by}"
    )
    group.add_argument("--rpm", metavar="N", help="model calls per period")
    group.add_argument(
        "--itpm",
        metavar="N",
        help="input tokens per period (uncached input and cache writes; cache reads are free)",
    )
    group.add_argument(
        "--otpm",
        metavar="N",
        help="output tokens per period (a call's max_tokens is charged when it starts)",
    )
    group.add_argument("--tpm", metavar="N", help="input and output tokens together per period")
    group.add_argument("--rate-period", metavar="S", help="seconds of the limits' window (60)")
    group.add_argument(
        "--rate-name",
        metavar="NAME",
        help="which shared limit (one per API key and model class; default 'default')",
    )


def _number(flag: str, text: str | None, kind: type[int] | type[float]) -> int | float | None:
    if text is None:
        return None
    try:
        return kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number of seconds"
        raise CliError(f"bad rate limit ({flag}): expected {what}, not {text!r}") from None


def call_rate(args: argparse.Namespace) -> CallRate | None:
    """The limit the flags ask for, or ``None`` (no flag given)."""
    limits = {
        field: _number(_FLAGS[field], getattr(args, attr), int)
        for field, attr in (
            ("requests", "rpm"),
            ("input_tokens", "itpm"),
            ("output_tokens", "otpm"),
            ("tokens", "tpm"),
        )
    }
    period = _number("--rate-period", args.rate_period, float)
    if all(value is None for value in limits.values()):
        if period is not None or args.rate_name is not None:
            raise CliError(
                "bad rate limit: --rate-period and --rate-name need a limit "
                "(--rpm, --itpm, --otpm or --tpm)"
            )
        return None
    from pydantic import ValidationError

    from anabranch.models._rate import CallRate

    options: dict[str, object] = {"period": 60.0 if period is None else period}
    if args.rate_name is not None:
        options["name"] = args.rate_name
    try:
        return CallRate(**limits, **options)
    except ValidationError as exc:
        problem = exc.errors()[0]
        field = ".".join(str(part) for part in problem["loc"])
        flag = _FLAGS.get(field, "rate")
        message = str(problem["msg"]).removeprefix("Value error, ")
        raise CliError(f"bad rate limit ({flag}): {message}") from None
