"""Read-only views of sessions for the CLI and users: lists and run trees."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from anabranch.context._cache import cache_read_ratio
from anabranch.context._pricing import Cost, PriceTable
from anabranch.messages import Usage
from anabranch.runtime._history import boundary_extra, call_usage
from anabranch.store import BoundaryRecord, CallRecord, RunRecord, SessionRecord, Store

__all__ = [
    "CacheBreakInfo",
    "CallStats",
    "RunNode",
    "SessionSummary",
    "Totals",
    "list_sessions",
    "session_status",
    "session_tree",
    "summarizer_usage",
    "total_usage",
    "tree_totals",
]


@dataclass(frozen=True)
class CacheBreakInfo:
    """A recorded cache break: the call read less than the run's previous call left."""

    run_id: str
    call_id: int
    cause: str
    expected_read: int
    actual_read: int
    created: float


@dataclass
class CallStats:
    """One successful model call with its cache accounting and estimated cost."""

    call: CallRecord
    usage: Usage
    cost: Cost | None
    """``None`` when the model has no price in the table."""
    cache_break: CacheBreakInfo | None = None

    @property
    def read_ratio(self) -> float:
        return cache_read_ratio(self.usage)


@dataclass
class RunNode:
    """One agent run in a session's tree, with its own accounting."""

    run: RunRecord
    turns: int = 0
    usage: Usage = field(default_factory=Usage)
    failed_attempts: int = 0
    compactions: int = 0
    children: list[RunNode] = field(default_factory=list)
    calls: list[CallStats] = field(default_factory=list)
    cost: Cost = field(default_factory=Cost)
    """Estimated cost of the calls whose model has a price."""
    unpriced_calls: int = 0
    cache_breaks: list[CacheBreakInfo] = field(default_factory=list)

    @property
    def read_ratio(self) -> float:
        """Share of this run's input tokens read from cache."""
        return cache_read_ratio(self.usage)


@dataclass
class SessionSummary:
    session: SessionRecord
    status: str
    """``done``/``failed``/``running`` (a live process has it) or ``interrupted``."""
    agents: int
    usage: Usage


def summarizer_usage(boundary: BoundaryRecord) -> Usage | None:
    """Tokens a compaction's summarizer call used (recorded in the boundary), if any."""
    usage = boundary_extra(boundary).get("usage")
    return Usage.model_validate(usage) if isinstance(usage, dict) else None


def total_usage(calls: Sequence[CallRecord], boundaries: Sequence[BoundaryRecord]) -> Usage:
    """Every paid token: successful agent calls plus compaction summarizer calls."""
    total = Usage()
    for call in calls:
        if call.status == "ok" and call.usage:
            total = total + call_usage(call)
    for boundary in boundaries:
        summarizer = summarizer_usage(boundary)
        if summarizer is not None:
            total = total + summarizer
    return total


async def session_status(store: Store, session: SessionRecord) -> str:
    """``done``/``failed`` once finished for good, ``running`` while a live process holds its
    lease, else ``interrupted`` (resumable). ``sessions`` and ``show`` both print this."""
    if session.status in ("done", "failed") and session.finished is not None:
        runs = await store.list_runs(session.id)
        roots = [r for r in runs if r.parent_run_id is None]
        if roots and all(r.status in ("done", "failed", "cancelled") for r in roots):
            return session.status
    if await store.lease_holder(session.id):
        return "running"
    if session.status in ("waiting", "incomplete"):
        return session.status  # paused for an approval, or stopped by a limit
    return "interrupted"


async def list_sessions(store: Store, limit: int = 50) -> list[SessionSummary]:
    """Newest sessions first, with status, agent-run count and total usage."""
    summaries = []
    for session in await store.list_sessions(limit):
        runs = await store.list_runs(session.id)
        calls = await store.session_calls(session.id)
        boundaries = await store.list_boundaries(session_id=session.id)
        summaries.append(
            SessionSummary(
                session=session,
                status=await session_status(store, session),
                agents=len(runs),
                usage=total_usage(calls, boundaries),
            )
        )
    return summaries


async def session_tree(
    store: Store, session_id: str, prices: PriceTable | None = None
) -> list[RunNode]:
    """The session's runs as a forest (roots first, children under their parents), with
    per-call and per-run cache accounting, cache breaks and estimated cost."""
    prices = prices or PriceTable()
    runs = await store.list_runs(session_id)
    calls = await store.session_calls(session_id)
    boundaries = await store.list_boundaries(session_id=session_id)
    breaks = {
        row["call_id"]: CacheBreakInfo(
            run_id=row["run_id"],
            call_id=row["call_id"],
            cause=row["cause"],
            expected_read=row["expected_read"],
            actual_read=row["actual_read"],
            created=row["created"],
        )
        for row in await store.list_cache_breaks(session_id)
    }
    nodes = {r.id: RunNode(run=r) for r in runs}
    for call in calls:
        node = nodes.get(call.run_id)
        if node is None:
            continue
        if call.status == "ok":
            node.turns += 1
            usage = call_usage(call)
            node.usage = node.usage + usage
            cost = prices.cost(call.model or node.run.model, usage)
            if cost is None:
                node.unpriced_calls += 1
            else:
                node.cost = node.cost + cost
            found = breaks.get(call.id) if call.id is not None else None
            node.calls.append(CallStats(call=call, usage=usage, cost=cost, cache_break=found))
            if found is not None:
                node.cache_breaks.append(found)
        elif call.status == "error":
            node.failed_attempts += 1
    for boundary in boundaries:
        node = nodes.get(boundary.run_id)
        if node is None:
            continue
        if boundary.kind == "compaction" and boundary.status == "ok":
            node.compactions += 1
        summarizer = summarizer_usage(boundary)
        if summarizer is not None:
            # the summarizer's call is not an agent turn, but its tokens are paid for
            node.usage = node.usage + summarizer
            cost = prices.cost(boundary.model or node.run.model, summarizer)
            if cost is None:
                node.unpriced_calls += 1
            else:
                node.cost = node.cost + cost
    roots: list[RunNode] = []
    for run in runs:
        node = nodes[run.id]
        parent = nodes.get(run.parent_run_id) if run.parent_run_id else None
        (parent.children if parent else roots).append(node)
    return roots


@dataclass
class Totals:
    """Sums over every run of a session."""

    runs: int = 0
    turns: int = 0
    usage: Usage = field(default_factory=Usage)
    cost: Cost = field(default_factory=Cost)
    unpriced_calls: int = 0
    compactions: int = 0
    cache_breaks: list[CacheBreakInfo] = field(default_factory=list)

    @property
    def read_ratio(self) -> float:
        """Share of the session's input tokens read from cache."""
        return cache_read_ratio(self.usage)


def tree_totals(roots: list[RunNode]) -> Totals:
    """Turns, usage, cost, compactions and cache breaks summed over a forest of runs."""
    total = Totals()
    stack = list(roots)
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        total.runs += 1
        total.turns += node.turns
        total.usage = total.usage + node.usage
        total.cost = total.cost + node.cost
        total.unpriced_calls += node.unpriced_calls
        total.compactions += node.compactions
        total.cache_breaks += node.cache_breaks
    total.cache_breaks.sort(key=lambda b: b.call_id)
    return total
