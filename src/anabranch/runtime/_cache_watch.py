"""Cache-break detection: after each call, compare it with the run's previous call.

When a call reads less cache than the previous successful call of the same run left
(everything it read or wrote), the break is recorded in the store with its cause and
emitted as a span event.
"""

from __future__ import annotations

from dataclasses import dataclass

from anabranch.context._cache import (
    CacheBreakCause,
    CallCacheState,
    classify_cache_break,
    expected_cache_read,
    message_ttl,
    system_digest,
    tools_digest,
)
from anabranch.messages import ModelResponse
from anabranch.runtime._history import call_usage, snapshot_blocks
from anabranch.runtime._view import RunView
from anabranch.store import CallRecord, Store

__all__ = ["REPORTED_CAUSES", "CacheBreak", "check_cache_break"]

REPORTED_CAUSES: dict[str, CacheBreakCause] = {
    "model_changed": "model_changed",
    "system_changed": "system_changed",
    "tools_changed": "tools_changed",
    "messages_changed": "messages_changed",
}
"""Cache-miss reasons the API's cache diagnostics report, as our causes (the others,
``previous_message_not_found`` and ``unavailable``, leave the inferred cause)."""


@dataclass(frozen=True)
class CacheBreak:
    """A call that read less cache than the previous call of its run left."""

    run_id: str
    call_id: int
    cause: CacheBreakCause
    expected_read: int
    actual_read: int
    idle_seconds: float


async def _digests(store: Store, run_id: str, version: int | None) -> tuple[str, str]:
    snapshot = await store.get_snapshot(run_id, version) if version is not None else None
    if snapshot is None:
        return "", ""
    system, tools = snapshot_blocks(snapshot)
    return system_digest(system), tools_digest(tools)


def _state(call: CallRecord, model: str, digests: tuple[str, str]) -> CallCacheState:
    return CallCacheState(
        model=model,
        system_digest=digests[0],
        tools_digest=digests[1],
        compactions=call.compactions or 0,
        started=call.created,
        usage=call_usage(call),
        settings=call.settings or "",
    )


async def check_cache_break(
    run: RunView, call_id: int, response: ModelResponse
) -> CacheBreak | None:
    """Record (and emit) a cache break for ``call_id`` if there is one."""
    policy = run.agent.context
    if not policy.cache_breakpoints:
        return None
    store = run.store
    calls = await store.recent_ok_calls(run.id, up_to=call_id, limit=2)
    if len(calls) < 2 or calls[0].id != call_id:
        return None
    current, previous = calls
    if current.snapshot_version == previous.snapshot_version:
        here = before = (system_digest(run.system), tools_digest(run.tools))
    else:
        here = await _digests(store, run.id, current.snapshot_version)
        before = await _digests(store, run.id, previous.snapshot_version)
    previous_state = _state(previous, previous.model or run.agent.model, before)
    current_state = _state(current, response.model or run.agent.model, here)
    cause = classify_cache_break(
        previous_state,
        current_state,
        ttl=message_ttl(policy.cache_ttl, policy.prefix_cache_ttl),
    )
    if cause is None:
        return None
    reported = REPORTED_CAUSES.get(response.cache_miss or "")
    if reported is not None:  # the API's diagnosis is exact: it wins over the inference
        cause = reported
    found = CacheBreak(
        run_id=run.id,
        call_id=call_id,
        cause=cause,
        expected_read=expected_cache_read(previous_state.usage),
        actual_read=current_state.usage.cache_read_input_tokens,
        idle_seconds=max(current.created - previous.created, 0.0),
    )
    await store.add_cache_break(run.id, call_id, cause, found.expected_read, found.actual_read)
    run.tracing.cache_break(
        cause=cause,
        expected_read=found.expected_read,
        actual_read=found.actual_read,
        idle_seconds=found.idle_seconds,
    )
    return found
