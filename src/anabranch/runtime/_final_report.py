"""The end of a run a limit stopped: one final model call without tools writes its report
(marked incomplete); with ``on_limit="fail"`` the run fails as it always did."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from anabranch import events as ev
from anabranch.errors import BudgetExceeded, MaxTurnsExceeded, ModelError
from anabranch.messages import TextBlock
from anabranch.runtime._findings import findings_record
from anabranch.runtime._run_limits import LimitedRun, LimitStop, SessionLimits, session_limits

__all__ = ["fail_for", "final_report"]


def fail_for(run: LimitedRun, stop: LimitStop) -> Exception:
    """The error ``on_limit="fail"`` raises for ``stop``."""
    if stop.reason == "max_turns":
        return MaxTurnsExceeded(run.agent.name, run.agent.max_turns)
    if stop.reason == "timeout":
        return TimeoutError(stop.detail)
    return BudgetExceeded(f"agent {run.agent.name!r} reached {stop.detail}", scope=stop.scope)


async def final_report(
    run: LimitedRun,
    stop: LimitStop,
    take_turn: Callable[..., Awaitable[object]],
) -> str:
    """End ``run`` at ``stop``: one model call without tools writes its report, recorded
    as the run's (incomplete) output. If that call fails, the run fails and its output is
    the runtime's record of what it found.

    ``take_turn(tool_choice=..., max_tokens=...)`` makes one model turn (the loop's own).
    """
    store = run.env.store
    limits = session_limits(run.env)
    tokens, dollars = await limits.remaining(run.id)
    run.env.tracing.limit_reached(
        reason=stop.reason, detail=stop.detail, remaining_tokens=tokens, remaining_usd=dollars
    )
    run.events.emit(
        ev.LimitReached,
        reason=stop.reason,
        detail=stop.detail,
        scope=stop.scope,
        remaining_tokens=tokens,
        remaining_usd=dollars,
    )
    reporting = run.record.parent_run_id is not None or run.record.task_id is not None
    if run.agent.on_limit == "fail":
        error = fail_for(run, stop)
        await store.finish_run(run.id, "failed", error=str(error))
        raise error
    if stop.reason == "budget" and reporting and await _exhausted(limits, run.id):
        # nothing left even for a report: the runtime's record stands in for it (a root
        # run still writes its answer: one call past the budget, never no answer)
        record = await findings_record(store, run.id)
        await store.finish_run(run.id, "incomplete", output=record, error=stop.describe())
        return record
    max_tokens = min(run.agent.max_tokens, run.agent.max_report_tokens * 2) if reporting else None
    try:
        await take_turn(tool_choice="none" if run.tools else None, max_tokens=max_tokens)
    except ModelError as error:
        record = await findings_record(store, run.id)
        message = f"{stop.describe()}; its final report failed: {error}"
        await store.finish_run(run.id, "failed", output=record, error=message)
        raise
    last = run.context[-1]
    output = "\n".join(
        b.text for b in last.content if isinstance(b, TextBlock) and b.text.strip()
    ) or await findings_record(store, run.id)
    await store.finish_run(run.id, "incomplete", output=output, error=stop.describe())
    return output


async def _exhausted(limits: SessionLimits, run_id: str) -> bool:
    """Whether some budget of the run has nothing left, not even for a report."""
    return any(scope.share() >= 1.0 for scope in await limits.scopes(run_id))
