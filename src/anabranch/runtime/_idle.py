"""Idle compaction: a conversation between turns is compacted while its prompt cache is
still warm, so the request after a long pause does not re-process everything uncached.

A context is cached for ``ContextPolicy.cache_ttl`` (5 minutes, or an hour) after its
latest call. A session idle for ``idle_compact_after`` of that TTL whose context is at
least ``idle_compact_min_tokens`` is compacted now: the summarizer's request reads the
cached prefix, and the next turn, whenever it comes, sends only the compacted context.
After the TTL it is too late (the summary would read everything uncached, as the next
turn would): such a session is left alone.

``IdleCompactor.sweep`` is one pass at its clock's time; ``IdleCompactor.watch`` runs passes
until cancelled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import anyio

from anabranch.agents import ContextPolicy
from anabranch.errors import SessionBusyError, UserError
from anabranch.messages import Usage
from anabranch.runtime._compactor import CompactionOutcome
from anabranch.runtime._conversation import compact_finished
from anabranch.runtime._session_view import root_run
from anabranch.store import SessionRecord, Store

if TYPE_CHECKING:
    from anabranch.runtime._runtime import Runtime

__all__ = ["TTL_SECONDS", "IdleCompaction", "IdleCompactor", "IdleSweep", "idle_window"]

TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
"""How long the API keeps a cache entry after its last use, per ``cache_ttl``."""
SWEEP_SESSIONS = 100
"""How many of the most recent sessions one pass looks at when not given a list."""
_PENDING = CompactionOutcome(applied=False)


@dataclass(frozen=True)
class IdleCompaction:
    """One session compacted because it was idle."""

    session_id: str
    run_id: str
    idle_seconds: float
    """Seconds since its latest call, at the time of the pass."""
    tokens_before: int
    outcome: CompactionOutcome


@dataclass(frozen=True)
class IdleSweep:
    """What one pass did, and when the next session becomes due."""

    compacted: list[IdleCompaction] = field(default_factory=list)
    next_due: float | None = None
    """Wall-clock time at which a session seen in this pass becomes due (None: none)."""


def idle_window(policy: ContextPolicy, last_call: float) -> tuple[float, float] | None:
    """``(due, expires)``: when a context last sent at ``last_call`` should be compacted,
    and when its cache expires; None when the policy turned idle compaction off."""
    if not policy.idle_compaction:
        return None
    ttl = TTL_SECONDS[policy.cache_ttl]
    return last_call + policy.idle_compact_after * ttl, last_call + ttl


class IdleCompactor:
    """Compacts a runtime's idle conversations before their prompt cache expires.

    ``await IdleCompactor(rt).sweep()`` is one pass; run ``watch()`` in a task group to keep
    doing it while the process waits for the next turn. ``clock`` is the wall clock the
    passes use (tests pass their own, so nothing sleeps to move time on).
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        clock: Callable[[], float] = time.time,
        interval: float = 60.0,
        sessions: int = SWEEP_SESSIONS,
    ) -> None:
        if interval <= 0:
            raise UserError(f"interval must be a positive number of seconds, not {interval}")
        self.runtime = runtime
        self.clock = clock
        self.interval = interval
        self.sessions = sessions

    async def sweep(self, session_ids: Sequence[str] | None = None) -> IdleSweep:
        """Compact every finished agent session (a conversation between turns) due now;
        a session being driven, of an agent this runtime cannot find, or below the
        minimum size is left alone. ``session_ids``: only these (default: the most
        recent ``sessions``)."""
        now = self.clock()
        store = self.runtime.store
        if session_ids is None:
            records = await store.list_sessions(limit=self.sessions)
        else:
            found = [await store.get_session(s) for s in session_ids]
            records = [r for r in found if r is not None]
        compacted: list[IdleCompaction] = []
        upcoming: list[float] = []
        for session in records:
            due = await self._due(store, session, now)
            if due is None:
                continue
            if isinstance(due, float):
                upcoming.append(due)
                continue
            try:
                rt = self.runtime
                outcome = await compact_finished(
                    rt, rt._driver.lease, due.session_id, None, trigger="idle"
                )
            except (SessionBusyError, UserError):
                continue  # being driven (not idle), or its turn is not finished any more
            compacted.append(replace(due, outcome=outcome))
        return IdleSweep(compacted, min(upcoming, default=None))

    async def watch(self, on_compacted: Callable[[IdleCompaction], object] | None = None) -> None:
        """Passes until cancelled: after each, wait until the next session is due (at most
        ``interval`` seconds, so sessions that finish meanwhile are seen)."""
        while True:
            found = await self.sweep()
            for done in found.compacted:
                if on_compacted is not None:
                    on_compacted(done)
            wait = self.interval if found.next_due is None else found.next_due - self.clock()
            await anyio.sleep(min(self.interval, max(0.0, wait)))

    async def _due(
        self, store: Store, session: SessionRecord, now: float
    ) -> IdleCompaction | float | None:
        """Due now (what to record), due later (when), or never (None)."""
        if session.kind != "agent" or session.status not in ("done", "incomplete"):
            return None
        try:
            agent = self.runtime.resolve_agent(session)
        except UserError:
            return None  # not an agent this process knows: its owner compacts it
        root = await root_run(store, session.id)
        if root is None or root.status not in ("done", "incomplete"):
            return None
        call = await store.last_call(root.id, ok=True)
        if call is None or call.usage is None:
            return None
        window = idle_window(agent.context, call.created)
        if window is None or now >= window[1]:
            return None  # off, or too late: the cache is gone either way
        usage = Usage.model_validate_json(call.usage)
        tokens = usage.total_input_tokens + usage.output_tokens
        boundary = await store.latest_boundary(root.id)
        if tokens < agent.context.idle_compact_min_tokens or (
            boundary is not None and boundary.created >= call.created
        ):
            return None  # small, or compacted since its latest call
        if now < window[0]:
            return window[0]
        return IdleCompaction(session.id, root.id, now - call.created, tokens, _PENDING)
