"""Cache-break detection: after each call, compare it with the run's previous call.

When a call reads less cache than the previous successful call of the same run left
(everything it read or wrote), the break is recorded in the store with its cause and
emitted as a span event. A run's ``CacheWatch`` remembers its latest successful call, so
the store is read for the previous call only on the first call after the run was loaded
(and not even then at its first turn, which has none before it).
"""

from __future__ import annotations

from collections.abc import Awaitable
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
from anabranch.messages import ModelResponse, Usage
from anabranch.runtime._history import call_usage, snapshot_blocks
from anabranch.runtime._view import RunView
from anabranch.store import CallRecord, Store

__all__ = ["REPORTED_CAUSES", "CacheBreak", "CacheWatch"]

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


@dataclass(frozen=True)
class _OkCall:
    """What the check compares of one successful call."""

    id: int
    model: str | None
    created: float
    usage: Usage
    snapshot_version: int | None
    compactions: int
    settings: str

    @classmethod
    def of_record(cls, call: CallRecord) -> _OkCall:
        return cls(
            id=call.id or 0,
            model=call.model,
            created=call.created,
            usage=call_usage(call),
            snapshot_version=call.snapshot_version,
            compactions=call.compactions or 0,
            settings=call.settings or "",
        )

    @classmethod
    def answered(cls, call_id: int, call: CallRecord, response: ModelResponse) -> _OkCall:
        """A call made by this process, committed as ``call_id`` with ``response``."""
        return cls(
            id=call_id,
            model=response.model,
            created=call.created,
            usage=response.usage,
            snapshot_version=call.snapshot_version,
            compactions=call.compactions or 0,
            settings=call.settings or "",
        )

    def state(self, model: str, digests: tuple[str, str]) -> CallCacheState:
        return CallCacheState(
            model=model,
            system_digest=digests[0],
            tools_digest=digests[1],
            compactions=self.compactions,
            started=self.created,
            usage=self.usage,
            settings=self.settings,
        )


async def _stored_previous(run: RunView, call_id: int) -> _OkCall | None:
    """The run's successful call before ``call_id`` (which is committed ok), from the store."""
    calls = await run.store.recent_ok_calls(run.id, up_to=call_id, limit=2)
    if len(calls) < 2 or calls[0].id != call_id:
        return None
    return _OkCall.of_record(calls[1])


class CacheWatch:
    """Cache-break detection for one run, remembering the run's latest successful call."""

    def __init__(self) -> None:
        self._known = False
        """Whether the previous call is known (only after a call made by this run object)."""
        self._call_id = 0
        self._model: str | None = None
        self._created = 0.0
        self._usage: Usage | None = None
        self._snapshot_version: int | None = None
        self._compactions = 0
        self._settings = ""
        """The latest successful call made here: what a check compares of it, kept as
        values (not its row and response: nothing else keeps those once its answer is
        committed, and a run lives far longer than the cyclic GC's young generations);
        the record a check compares is built only for the check."""

    def after_call(
        self, run: RunView, call_id: int, call: CallRecord, response: ModelResponse
    ) -> Awaitable[CacheBreak | None] | None:
        """Record (and emit) a cache break for ``call`` (committed as ``call_id`` with its
        ``response``) if there is one; it becomes the previous call of the next check.

        ``None``: there is none, known without an await (the usual answer: no coroutine
        per model call); else the check, to be awaited at once, returning the break if any."""
        checks = run.agent.context.cache_breakpoints
        known, last_usage = self._known, self._usage
        previous = None
        if checks and known and last_usage is not None:
            if response.usage.cache_read_input_tokens < expected_cache_read(last_usage):
                previous = _OkCall(  # a break (``_check``'s first test, on the same counts)
                    id=self._call_id,
                    model=self._model,
                    created=self._created,
                    usage=last_usage,
                    snapshot_version=self._snapshot_version,
                    compactions=self._compactions,
                    settings=self._settings,
                )
        self._known, self._call_id, self._model = True, call_id, response.model
        self._created, self._usage = call.created, response.usage
        self._snapshot_version, self._compactions = call.snapshot_version, call.compactions or 0
        self._settings = call.settings or ""
        if not checks:
            return None
        if not known:  # a run's ok calls are its turns 1..n: none is before the first turn
            return None if call.turn == 1 else _check_stored(run, call_id, call, response)
        if previous is None:
            return None  # no break: nothing built
        return _check(run, _OkCall.answered(call_id, call, response), previous, response)


async def _check_stored(
    run: RunView, call_id: int, call: CallRecord, response: ModelResponse
) -> CacheBreak | None:
    """The check of a run's first call made here: its previous call read from the store."""
    previous = await _stored_previous(run, call_id)
    if previous is None:
        return None
    return await _check(run, _OkCall.answered(call_id, call, response), previous, response)


async def _check(
    run: RunView, current: _OkCall, previous: _OkCall, response: ModelResponse
) -> CacheBreak | None:
    if current.usage.cache_read_input_tokens >= expected_cache_read(previous.usage):
        return None  # no break (``classify_cache_break``'s first test): no digest needed
    policy = run.agent.context
    store = run.store
    if current.snapshot_version == previous.snapshot_version:
        here = before = (system_digest(run.system), tools_digest(run.tools))
    else:
        here = await _digests(store, run.id, current.snapshot_version)
        before = await _digests(store, run.id, previous.snapshot_version)
    previous_state = previous.state(previous.model or run.agent.model, before)
    current_state = current.state(response.model or run.agent.model, here)
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
        call_id=current.id,
        cause=cause,
        expected_read=expected_cache_read(previous_state.usage),
        actual_read=current_state.usage.cache_read_input_tokens,
        idle_seconds=max(current.created - previous.created, 0.0),
    )
    await store.add_cache_break(run.id, current.id, cause, found.expected_read, found.actual_read)
    run.tracing.cache_break(
        cause=cause,
        expected_read=found.expected_read,
        actual_read=found.actual_read,
        idle_seconds=found.idle_seconds,
    )
    return found
