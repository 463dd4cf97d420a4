"""The compaction circuit breaker, read from a run's boundary rows (so it survives resume).

After ``max_compaction_failures`` failed (or ineffective) compactions in a row a ``breaker``
row opens it. While open, compactions use the fallback (the ``window`` strategy, which
needs no model and leaves an explicit note of what it dropped). After ``COOL_DOWN``
fallback compactions it is **half-open**: the configured strategy is tried again; success
closes it, failure opens it again (a new breaker row) and the fallback applies at once.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any, Literal

from opentelemetry.trace import Span

from anabranch.errors import CompactionFailedError
from anabranch.store import BoundaryRecord

if TYPE_CHECKING:
    from anabranch.runtime._loop import AgentRun

__all__ = [
    "COOL_DOWN",
    "BreakerState",
    "breaker_open",
    "breaker_state",
    "check_breaker",
    "consecutive_failures",
    "fail_run",
    "open_breaker",
    "record_failure",
]

_log = logging.getLogger("anabranch.compaction")

COOL_DOWN = 3
"""Fallback compactions before the configured strategy is tried again."""

BreakerState = Literal["closed", "open", "half-open"]


def _extra(boundary: BoundaryRecord) -> dict[str, object]:
    data = json.loads(boundary.extra) if boundary.extra else {}
    return data if isinstance(data, dict) else {}


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
        if boundary.status == "ok" and not _extra(boundary).get("ineffective"):
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
            extra = _extra(boundary)
            if not extra.get("degraded") and not extra.get("ineffective"):
                return "closed"
            fallbacks += bool(extra.get("degraded"))
    return "closed"


def breaker_open(boundaries: list[BoundaryRecord]) -> bool:
    """Whether the breaker is open or half-open (not yet closed again)."""
    return breaker_state(boundaries) != "closed"


async def record_failure(
    run: AgentRun,
    span: Span,
    strategy: str,
    trigger: str,
    tokens_before: int,
    started: float,
    failure: str,
    details: dict[str, Any],
) -> None:
    details.pop("summary", None)
    details.pop("manifest", None)
    await run.env.store.add_boundary(
        BoundaryRecord(
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
    )
    _log.warning("compaction of %s (run %s) failed: %s", run.agent.name, run.id, failure)
    await check_breaker(run, span=span, failure=failure)


async def check_breaker(run: AgentRun, *, span: Span | None, failure: str) -> None:
    """Open the breaker when failures reach the policy's limit (once), then apply it."""
    policy = run.agent.context
    boundaries = await run.env.store.list_boundaries(run_id=run.id)
    failures = consecutive_failures(boundaries)
    if failures < policy.max_compaction_failures:
        return
    if breaker_state(boundaries) == "closed":
        await open_breaker(run, span, failure, failures=failures)
    if policy.on_compaction_failure == "fail":
        await fail_run(
            run,
            f"compaction circuit breaker open for agent {run.agent.name!r} (run {run.id}): "
            f"{failures} failures in a row; last: {failure}",
        )


async def open_breaker(run: AgentRun, span: Span | None, failure: str, *, failures: int) -> None:
    policy = run.agent.context
    await run.env.store.add_boundary(
        BoundaryRecord(
            run_id=run.id,
            kind="breaker",
            prefix="[]",
            ranges="[]",
            created=time.time(),
            status="open",
            error=failure,
            extra=json.dumps({"failures": failures, "policy": policy.on_compaction_failure}),
        )
    )
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
        run.env.tracing.event(
            span,
            "compaction.breaker_open",
            {"failures": failures, "policy": policy.on_compaction_failure},
        )


async def fail_run(run: AgentRun, message: str) -> None:
    await run.env.store.finish_run(run.id, "failed", error=message)
    error = CompactionFailedError(message)
    error.session_id = run.env.session_id
    raise error
