"""Typed, JSON-stable views of a stored session: the run tree with per-agent and rolled-up
accounting, every call, every compaction. ``show --json``, ``compactions --json`` and
the HTML report are built from these (fields are only ever added; see docs/json.md)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from anabranch.context._cache import cache_read_ratio
from anabranch.context._pricing import PriceTable
from anabranch.messages import Usage
from anabranch.runtime._history import boundary_extra, outline_from
from anabranch.runtime._report import CallStats, RunNode, session_tree
from anabranch.store import BoundaryRecord, SessionRecord, Store

__all__ = [
    "SCHEMA_VERSION",
    "CallView",
    "CompactionView",
    "RollUp",
    "RunView",
    "SessionView",
    "compaction_views",
    "session_view",
]

SCHEMA_VERSION = 1


class _View(BaseModel):
    model_config = ConfigDict(frozen=True)


class CallView(_View):
    """One successful model call of a run."""

    id: int | None
    turn: int
    attempt: int
    created: float
    finished: float | None
    model: str | None
    usage: Usage
    context_tokens: int
    """Tokens of the request plus the answer: how full the context was after this call."""
    cost: float | None
    cache_read_share: float
    compactions_before: int
    cache_break: str | None = None
    """The cause, when this call read less cache than the previous call left."""


class CompactionView(_View):
    """One boundary: a compaction, a clear, a rewind or the breaker opening."""

    id: int | None
    run_id: str
    agent: str | None
    kind: str
    trigger: str | None
    strategy: str | None
    status: str
    created: float
    tokens_before: int | None
    tokens_after: int | None
    messages_before: int | None
    messages_after: int | None
    duration: float | None
    model: str | None
    error: str | None
    summary: str | None
    details: dict[str, Any] = Field(default_factory=dict)
    """Everything else the store recorded (e.g. a loss manifest), as stored."""


class RollUp(_View):
    """A run plus everything below it."""

    runs: int
    usage: Usage
    cost: float
    unpriced_calls: int
    cache_read_share: float


class RunView(_View):
    id: str
    agent: str
    model: str
    status: str
    mode: str
    depth: int
    task_id: str | None
    parent_run_id: str | None
    parent_call_id: str | None
    created: float
    finished: float | None
    window: int | None
    threshold: int | None
    turns: int
    failed_attempts: int
    compactions: int
    usage: Usage
    cost: float
    unpriced_calls: int
    cache_read_share: float
    calls: list[CallView]
    children: list[RunView]
    rolled_up: RollUp


class SessionView(_View):
    schema_version: int = SCHEMA_VERSION
    id: str
    kind: str
    entry: str
    task: str
    status: str
    created: float
    finished: float | None
    output: str | None
    error: str | None
    usage: Usage
    cost: float
    cache_read_share: float
    runs: list[RunView]
    """The root runs (one for an agent session; one per task for a graph)."""
    compactions: list[CompactionView]


def _limits(definition: str | None) -> dict[str, tuple[int | None, int | None]]:
    """Window and threshold per agent name, from the session's stored outline."""
    found: dict[str, tuple[int | None, int | None]] = {}
    outline = outline_from(definition)
    if not outline:
        return found
    stack = [outline] + list(outline.get("tasks", []) if isinstance(outline, dict) else [])
    while stack:
        item = stack.pop()
        if not isinstance(item, dict):
            continue
        name = item.get("name") if "tasks" not in item else None
        if isinstance(item.get("agent"), str):  # a graph task names its agent
            name = item["agent"]
        if isinstance(name, str) and "window" in item:
            found.setdefault(name, (item.get("window"), item.get("threshold")))
        stack.extend(item.get("subagents", []))
    return found


def _call_view(stats: CallStats) -> CallView:
    call, usage = stats.call, stats.usage
    return CallView(
        id=call.id,
        turn=call.turn,
        attempt=call.attempt,
        created=call.created,
        finished=call.finished,
        model=call.model,
        usage=usage,
        context_tokens=usage.total_input_tokens + usage.output_tokens,
        cost=stats.cost.total if stats.cost is not None else None,
        cache_read_share=stats.read_ratio,
        compactions_before=call.compactions or 0,
        cache_break=stats.cache_break.cause if stats.cache_break else None,
    )


def _run_view(node: RunNode, limits: dict[str, tuple[int | None, int | None]]) -> RunView:
    children = [_run_view(child, limits) for child in node.children]
    usage = node.usage
    cost = node.cost.total
    unpriced = node.unpriced_calls
    runs = 1
    for child in children:
        usage = usage + child.rolled_up.usage
        cost += child.rolled_up.cost
        unpriced += child.rolled_up.unpriced_calls
        runs += child.rolled_up.runs
    run = node.run
    window, threshold = limits.get(run.agent_name, (None, None))
    return RunView(
        id=run.id,
        agent=run.agent_name,
        model=run.model,
        status=run.status,
        mode=run.mode,
        depth=run.depth,
        task_id=run.task_id,
        parent_run_id=run.parent_run_id,
        parent_call_id=run.parent_call_id,
        created=run.created,
        finished=run.finished,
        window=window,
        threshold=threshold,
        turns=node.turns,
        failed_attempts=node.failed_attempts,
        compactions=node.compactions,
        usage=node.usage,
        cost=node.cost.total,
        unpriced_calls=node.unpriced_calls,
        cache_read_share=node.read_ratio,
        calls=[_call_view(c) for c in node.calls],
        children=children,
        rolled_up=RollUp(
            runs=runs,
            usage=usage,
            cost=cost,
            unpriced_calls=unpriced,
            cache_read_share=cache_read_ratio(usage),
        ),
    )


_KNOWN_BOUNDARY_FIELDS = {
    "id",
    "run_id",
    "kind",
    "trigger",
    "strategy",
    "status",
    "created",
    "tokens_before",
    "tokens_after",
    "messages_before",
    "messages_after",
    "duration",
    "model",
    "error",
    "summary",
    "prefix",
    "ranges",
    "extra",
    "details",
}


def _compaction_view(boundary: BoundaryRecord, agent: str | None) -> CompactionView:
    details: dict[str, Any] = {}
    details.update(boundary_extra(boundary))
    details.update(boundary.details or {})
    for name, value in vars(boundary).items():  # columns other engineers add land here too
        if name not in _KNOWN_BOUNDARY_FIELDS and value is not None:
            details[name] = value
    return CompactionView(
        id=boundary.id,
        run_id=boundary.run_id,
        agent=agent,
        kind=boundary.kind,
        trigger=boundary.trigger,
        strategy=boundary.strategy,
        status=boundary.status,
        created=boundary.created,
        tokens_before=boundary.tokens_before,
        tokens_after=boundary.tokens_after,
        messages_before=boundary.messages_before,
        messages_after=boundary.messages_after,
        duration=boundary.duration,
        model=boundary.model,
        error=boundary.error,
        summary=boundary.summary,
        details=details,
    )


async def compaction_views(store: Store, session_id: str) -> list[CompactionView]:
    runs = {r.id: r.agent_name for r in await store.list_runs(session_id)}
    boundaries = await store.list_boundaries(session_id=session_id)
    return [_compaction_view(b, runs.get(b.run_id)) for b in boundaries]


async def session_view(
    store: Store, session: SessionRecord, prices: PriceTable | None = None
) -> SessionView:
    """The whole session as one typed, JSON-ready view."""
    roots = await session_tree(store, session.id, prices)
    limits = _limits(session.definition)
    runs = [_run_view(root, limits) for root in roots]
    usage = Usage()
    cost = 0.0
    for run in runs:
        usage = usage + run.rolled_up.usage
        cost += run.rolled_up.cost
    return SessionView(
        id=session.id,
        kind=session.kind,
        entry=session.entry,
        task=session.task,
        status=session.status,
        created=session.created,
        finished=session.finished,
        output=session.output,
        error=session.error,
        usage=usage,
        cost=cost,
        cache_read_share=cache_read_ratio(usage),
        runs=runs,
        compactions=await compaction_views(store, session.id),
    )
