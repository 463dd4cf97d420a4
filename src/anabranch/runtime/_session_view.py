"""Read-only views of a session for people watching it: the root agent's context gauge."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.trace import Span

from anabranch.agents import Agent
from anabranch.context._pricing import PriceTable
from anabranch.messages import Usage
from anabranch.store import RunRecord, Store
from anabranch.traces import Tracing

__all__ = ["ContextGauge", "UsageTotals", "context_gauge", "root_run", "run_spend", "trace_spend"]

_PRICES = PriceTable()


@dataclass(frozen=True)
class ContextGauge:
    """How full the root agent's context is, as of its last answered call."""

    run_id: str
    tokens: int
    window: int
    threshold: int
    messages: int
    compactions: int


async def root_run(store: Store, session_id: str) -> RunRecord | None:
    runs = await store.list_runs(session_id)
    return next((r for r in runs if r.parent_run_id is None and r.task_id is None), None)


async def context_gauge(store: Store, session_id: str, agent: Agent) -> ContextGauge | None:
    """The gauge of ``session_id``'s root run (None before its first answer)."""
    root = await root_run(store, session_id)
    if root is None:
        return None
    call = await store.last_call(root.id, ok=True)
    if call is None or call.usage is None:
        return None
    usage = Usage.model_validate_json(call.usage)
    return ContextGauge(
        run_id=root.id,
        tokens=usage.total_input_tokens + usage.output_tokens,
        window=agent.context.window,
        threshold=agent.context.threshold,
        messages=call.message_count + 1,
        compactions=await store.count_boundaries(root.id, "ok"),
    )


class UsageTotals:
    """Usage of calls summed in place as they commit: no object per call outlives it (a
    run's total lives as long as the run, across every model call's wait)."""

    __slots__ = ("_sums",)

    def __init__(self) -> None:
        self._sums = dict.fromkeys(Usage.model_fields, 0)

    def add(self, usage: Usage) -> None:
        sums, counts = self._sums, usage.__dict__  # a model's fields are in its ``__dict__``
        for key in sums:
            sums[key] += counts[key]

    def total(self) -> Usage:
        return Usage(**self._sums)


async def run_spend(
    store: Store, session_id: str, agent: Agent, run_id: str, own: UsageTotals | None = None
) -> tuple[Usage, float | None]:
    """Tokens and estimated USD of one run's own successful calls (None: unpriced).

    ``own``: their usage summed as they were committed, when every one of them was (a run
    started by this process); otherwise the store sums them."""
    if own is None:
        sums = await store.sum_call_usage(session_id, tuple(Usage.model_fields), run_id=run_id)
        usage = Usage(**sums)
    else:
        usage = own.total()
    cost = _PRICES.cost(agent.model, usage)
    return usage, cost.total if cost is not None else None


async def trace_spend(
    tracing: Tracing,
    span: Span,
    store: Store,
    agent: Agent,
    run: RunRecord,
    own: UsageTotals | None,
) -> None:
    """A run's own tokens and cost onto its ``invoke_agent`` span; nothing is summed for a
    span that records nothing. ``own``: see ``run_spend``."""
    if span.is_recording():
        tracing.agent_spend(span, *await run_spend(store, run.session_id, agent, run.id, own))
