"""The compaction circuit breaker, read from a run's boundary rows (so it survives resume).

After ``max_compaction_failures`` failed (or ineffective) compactions in a row a ``breaker``
row opens it. While open, compactions use the fallback (the ``window`` strategy, which
needs no model and leaves an explicit note of what it dropped). After ``COOL_DOWN``
fallback compactions it is **half-open**: the configured strategy is tried again; success
closes it, failure opens it again (a new breaker row) and the fallback applies at once.

Every function here is pure over a list of boundary rows (the stored ones and those a
compaction step is about to commit): the rows to add are returned, never written.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Literal

from opentelemetry.trace import Span

from anabranch.context._tokens import estimate_messages
from anabranch.runtime._context_view import ContextView
from anabranch.runtime._history import boundary_extra
from anabranch.store import BoundaryRecord

__all__ = [
    "COOL_DOWN",
    "BreakerState",
    "breaker_open",
    "breaker_state",
    "breaker_record",
    "breaker_verdict",
    "consecutive_failures",
    "failure_record",
    "warn_too_small",
]

_log = logging.getLogger("anabranch.compaction")

COOL_DOWN = 3
"""Fallback compactions before the configured strategy is tried again."""

BreakerState = Literal["closed", "open", "half-open"]


def consecutive_failures(boundaries: list[BoundaryRecord]) -> int:
    """Compaction failures (or ineffective compactions) in a row, newest first.

    A successful compaction or a rewind ends the run of failures; clears and breaker
    rows are neutral.
    """
    count = 0
    for boundary in reversed(boundaries):
        if boundary.kind == "rewind":
            break
        if boundary.kind != "compaction":
            continue
        if boundary.status == "ok" and not boundary_extra(boundary).get("ineffective"):
            break
        count += 1
    return count


def breaker_state(boundaries: list[BoundaryRecord]) -> BreakerState:
    """The breaker's state (see the module docstring)."""
    fallbacks = 0
    for boundary in reversed(boundaries):
        if boundary.kind == "rewind":
            return "closed"
        if boundary.kind == "breaker":
            return "half-open" if fallbacks >= COOL_DOWN else "open"
        if boundary.kind == "compaction" and boundary.status == "ok":
            extra = boundary_extra(boundary)
            if not extra.get("degraded") and not extra.get("ineffective"):
                return "closed"
            fallbacks += bool(extra.get("degraded"))
    return "closed"


def breaker_open(boundaries: list[BoundaryRecord]) -> bool:
    """Whether the breaker is open or half-open (not yet closed again)."""
    return breaker_state(boundaries) != "closed"


def failure_record(
    run: ContextView,
    strategy: str,
    trigger: str,
    tokens_before: int,
    started: float,
    failure: str,
    details: dict[str, Any],
) -> BoundaryRecord:
    """The boundary row of a failed compaction attempt."""
    details.pop("summary", None)
    details.pop("manifest", None)
    _log.warning("compaction of %s (run %s) failed: %s", run.agent.name, run.id, failure)
    return BoundaryRecord(
        run_id=run.id,
        kind="compaction",
        prefix="[]",
        ranges="[]",
        created=time.time(),
        strategy=strategy,
        trigger=trigger,
        tokens_before=tokens_before,
        messages_before=len(run.context),
        model=details.pop("model", None),
        duration=time.monotonic() - started,
        status="failed",
        error=failure,
        extra=json.dumps(details),
    )


def breaker_verdict(
    run: ContextView, boundaries: list[BoundaryRecord], *, span: Span | None, failure: str
) -> tuple[BoundaryRecord | None, str | None]:
    """After a failure: the breaker row to add (when failures reach the policy's limit and
    it is closed), and why the run must fail (policy ``"fail"``), if it must."""
    policy = run.agent.context
    failures = consecutive_failures(boundaries)
    if failures < policy.max_compaction_failures:
        return None, None
    opened = None
    if breaker_state(boundaries) == "closed":
        opened = breaker_record(run, span, failure, failures=failures)
    if policy.on_compaction_failure != "fail":
        return opened, None
    return opened, (
        f"compaction circuit breaker open for agent {run.agent.name!r} (run {run.id}): "
        f"{failures} failures in a row; last: {failure}"
    )


def breaker_record(
    run: ContextView, span: Span | None, failure: str, *, failures: int
) -> BoundaryRecord:
    """The row that opens the breaker (logged, and an event on ``span``)."""
    policy = run.agent.context
    _log.warning(
        "compaction circuit breaker open for agent %r (run %s): %d failures in a row; "
        "last: %s; policy %r",
        run.agent.name,
        run.id,
        failures,
        failure,
        policy.on_compaction_failure,
    )
    if span is not None:
        run.tracing.event(
            span,
            "compaction.breaker_open",
            {"failures": failures, "policy": policy.on_compaction_failure},
        )
    return BoundaryRecord(
        run_id=run.id,
        kind="breaker",
        prefix="[]",
        ranges="[]",
        created=time.time(),
        status="open",
        error=failure,
        extra=json.dumps({"failures": failures, "policy": policy.on_compaction_failure}),
    )


WARNED = 10_000
"""Runs remembered as warned of a too-small window (the oldest forgotten first)."""


def warn_too_small(
    run: ContextView, warned: dict[str, None], window: int, threshold: int, fixed: int
) -> None:
    """Say once per run (``warned`` holds the runs told) that its window cannot hold one
    turn after its prompt (``fixed`` tokens of system and tools): why its compactions are
    ineffective, and what to change."""
    if run.id in warned:
        return
    warned[run.id] = None
    if len(warned) > WARNED:
        del warned[next(iter(warned))]
    last = estimate_messages(run.context[-2:])
    _log.warning(
        "agent %r (run %s): its window (%d tokens) cannot hold one turn: the prompt and "
        "tools take %d, the answer reserve %d, the latest turn %d; compaction cannot get "
        "below the threshold (%d). Raise ContextPolicy.window or make tool results smaller.",
        run.agent.name,
        run.id,
        window,
        fixed,
        run.agent.context.reserve,
        last,
        threshold,
    )
