"""Limits that end well: a run stopped by its turn limit, its time limit or a budget ends
with one final model call without tools that reports what it found.

One ``SessionLimits`` per session keeps the spend ledger of the session's tree (each run's
own spend; a child's spend counts toward every ancestor's and the session's) and the
budgets that apply: the session's, each agent run's (its definition's ``budget``, over its
subtree) and the tenant's (over a day or a month, shared through ``TenantLedger``).

The loop asks it at two points and tells it one thing:

- ``next_turn(run)`` while it builds the user turn that follows a tool turn: a stop (the
  turn then carries the stop notice and the final call follows) or soft-limit notes to add
  to that turn. Notices only ever enter a new user turn, never the cached prefix.
- ``before_call(run)`` before a model call whose user turn is already committed (a resumed
  run, a deadline that passed while a call was in flight): a stop, or ``None``.
- ``charge(run, model, usage)`` after every model call, summarizer calls included.
"""

from __future__ import annotations

import calendar
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import anyio

from anabranch import events as ev
from anabranch.agents import Agent, Budget
from anabranch.context._pricing import PriceTable
from anabranch.messages import Message, ToolDefinition, ToolUseBlock, Usage
from anabranch.runtime._environment import Environment
from anabranch.runtime._findings import findings_record, settle_subtree
from anabranch.runtime._limit_terms import (
    NO_NOTES,
    BudgetScope,
    LimitStop,
    Spend,
    StopReason,
    TurnNotes,
    parse_stop,
    spend_left,
    usage_tokens,
)
from anabranch.runtime._report import summarizer_usage
from anabranch.runtime._run_events import RunEvents
from anabranch.store import RunRecord, Store

__all__ = [
    "NO_NOTES",
    "LimitStop",
    "SessionLimits",
    "Spend",
    "StopReason",
    "TenantLedger",
    "TurnNotes",
    "continue_notice",
    "parse_stop",
    "period_start",
    "session_limits",
    "usage_tokens",
]


class LimitedRun(Protocol):
    """What the limits read of a run (the loop's ``AgentRun`` is one); never assigned."""

    @property
    def id(self) -> str: ...
    @property
    def agent(self) -> Agent: ...
    @property
    def record(self) -> RunRecord: ...
    @property
    def turns(self) -> int: ...
    @property
    def turn_base(self) -> int:
        """Turns done before this exchange of a conversation (``max_turns`` counts on)."""
        ...

    @property
    def env(self) -> Environment: ...
    @property
    def events(self) -> RunEvents: ...
    @property
    def tools(self) -> tuple[ToolDefinition, ...]: ...
    @property
    def context(self) -> Sequence[Message]: ...


REPORT_GRACE = 60.0
"""Seconds at most a timed-out run gets, past its deadline, for its final report."""
CHILD_TIME_SHARE = 0.9
"""A child must be done within this share of its parent's remaining time."""

USAGE_KEYS = tuple(Usage.model_fields)

NOT_RUN = "Not run: the run reached {detail} before this tool call could finish."


class TenantLedger(Protocol):
    """Where a tenant's spend is kept, so every process serving the tenant sees it."""

    async def tenant_spend(self, tenant: str, since: float) -> Spend: ...

    async def add_spend(self, tenant: str, session_id: str, run_id: str, spend: Spend) -> None: ...


def period_start(per: str | None, now: float | None = None) -> float:
    """Start (UTC, epoch seconds) of the day or month ``now`` is in; 0 for no period."""
    if per is None:
        return 0.0
    moment = time.gmtime(time.time() if now is None else now)
    day = 1 if per == "month" else moment.tm_mday
    start = (moment.tm_year, moment.tm_mon, day, 0, 0, 0, 0, 0, 0)
    return float(_timegm(start))


def _timegm(fields: tuple[int, ...]) -> int:
    return calendar.timegm(fields)


@dataclass
class _RunState:
    parent: str | None
    agent: Agent | None = None
    own: Spend = field(default_factory=Spend)
    last_call: Spend = field(default_factory=Spend)
    scope: BudgetScope | None = None
    deadline: float = math.inf
    """Soft deadline (``anyio.current_time()`` clock) of the current drive: its own, or
    earlier when its parent must be done sooner."""
    own_deadline: float = math.inf
    warned: set[str] | None = None
    """The budgets that warned this run (made at its first warning: most runs get none,
    and a run's state lives as long as its session)."""
    driving: bool = False


class SessionLimits:
    """The budgets of one session and its spend ledger, shared by all its runs."""

    def __init__(
        self,
        *,
        session_id: str = "",
        budget: Budget | None = None,
        tenant: str | None = None,
        tenant_budget: Budget | None = None,
        ledger: TenantLedger | None = None,
        prices: PriceTable | None = None,
    ) -> None:
        self.session_id = session_id
        self.prices = prices or PriceTable()
        self.session = (
            BudgetScope("session", "the session budget", budget)
            if budget is not None and budget.limited
            else None
        )
        self.tenant = tenant
        self.tenant_scope = (
            BudgetScope(f"tenant {tenant}", f"the budget of {tenant}", tenant_budget)
            if tenant is not None and tenant_budget is not None and tenant_budget.limited
            else None
        )
        self.ledger = ledger
        self.total = Spend()
        self._runs: dict[str, _RunState] = {}
        self._session_warned: set[str] = set()
        self._agent_budgets = False
        """Whether some run of the session has a budget of its own (``attach``)."""
        self._unread: tuple[Store, str, int] | None = None
        """A continued session's store, id and last call id before this process, while
        what its calls spent before it is not read."""
        self._reading: anyio.Lock | None = None

    # ------------------------------------------------------------------ ledger
    async def load(self, store: Store, session_id: str) -> None:
        """A continued session's runs and what it spent before this process: its
        summarizer calls now, its model calls now if the session has a budget, else
        (``read_spend``) when a run with a budget of its own is entered."""
        for record in await store.list_runs(session_id):
            self._state(record.id, record.parent_run_id)
        for boundary in await store.list_boundaries(session_id=session_id):
            summarized = summarizer_usage(boundary)
            if summarized is not None:
                self._record(boundary.run_id, self.spend_of(boundary.model or "", summarized))
        # calls begun from here on get higher ids and are charged as they finish
        self._unread = (store, session_id, await store.last_call_id())
        if self.session is not None:
            self.session.spent = Spend(self.total.tokens, self.total.cost_usd)  # summarizers'
            await self.read_spend()  # and the model calls'

    async def read_spend(self) -> None:
        """Add what the session's successful model calls spent before this process
        (``load``) to the ledger, once. A run's calls to one model are priced as one sum
        of their usage, summed in SQL (the price is linear in each key): a long session
        costs a row per run, not one per call.

        A session without budgets never reads it: nothing would be checked against it.
        Calls charged before it is read are not counted twice: the sums stop at the last
        call begun before ``load``."""
        if self._reading is None:
            self._reading = anyio.Lock()
        async with self._reading:  # runs entered at once wait for the one read
            if self._unread is None:
                return
            store, session_id, up_to = self._unread
            earlier = Spend()
            for summed in await store.call_usage_by_run(session_id, USAGE_KEYS, up_to=up_to):
                spend = self.spend_of(summed.model or "", Usage(**summed.sums))
                self._record(summed.run_id, spend)
                earlier.add(spend)
            if self.session is not None:
                self.session.spent.add(earlier)
            self._unread = None

    async def enter(self, run: LimitedRun) -> _RunState:
        """``attach``, once the session's earlier spend is read if the run's own budget
        counts it."""
        budget = run.agent.budget
        if self._unread is not None and budget is not None and budget.limited:
            await self.read_spend()
        return self.attach(run)

    def spend_of(self, model: str, usage: Usage) -> Spend:
        cost = self.prices.cost_usd(model, usage)
        return Spend(usage_tokens(usage), cost if cost is not None else 0.0)

    def _state(self, run_id: str, parent: str | None = None) -> _RunState:
        state = self._runs.get(run_id)
        if state is None:
            state = self._runs[run_id] = _RunState(parent)
        return state

    def _record(self, run_id: str, spend: Spend) -> None:
        state = self._state(run_id)
        state.own.add(spend)
        self.total.add(spend)

    def _lineage(self, run_id: str) -> list[_RunState]:
        """The run's state and its ancestors', nearest first."""
        chain = []
        seen: set[str] = set()
        current: str | None = run_id
        while current is not None and current not in seen and current in self._runs:
            seen.add(current)
            state = self._runs[current]
            chain.append(state)
            current = state.parent
        return chain

    def _subtree_spend(self, run_id: str) -> Spend:
        total = Spend()
        for other_id, state in self._runs.items():
            if any(s is self._runs[run_id] for s in self._lineage(other_id)):
                total.add(state.own)
        return total

    def attach(self, run: LimitedRun) -> _RunState:
        """Register a run before it is driven: its parent, its agent's budget, its deadline."""
        record: RunRecord = run.record
        state = self._state(record.id, record.parent_run_id)
        state.parent = record.parent_run_id
        state.agent = run.agent
        budget = run.agent.budget
        if budget is not None and budget.limited and state.scope is None:
            self._agent_budgets = True
            state.scope = BudgetScope(
                f"agent {run.agent.name}", "your budget", budget, self._subtree_spend(record.id)
            )
        now = anyio.current_time()
        timeout = run.agent.timeout if run.agent.on_limit == "report" else None
        state.own_deadline = now + timeout if timeout else math.inf
        state.deadline = state.own_deadline
        parent = self._runs.get(record.parent_run_id or "")
        if parent is not None and parent.deadline < math.inf:
            inherited = now + max(parent.deadline - now, 0.0) * CHILD_TIME_SHARE
            state.deadline = min(state.deadline, inherited)
        return state

    def hard_deadline(self, run_id: str) -> float:
        """When a run past its deadline is cut off even if its final report is not done."""
        state = self._runs.get(run_id)
        if state is None or state.deadline == math.inf:
            return math.inf
        timeout = state.agent.timeout if state.agent is not None else None
        grace = min(REPORT_GRACE, max(1.0, (timeout or REPORT_GRACE) * 0.5))
        return state.deadline + grace

    async def cut_off(self, env: Environment, run_id: str, agent: Agent, use: ToolUseBlock) -> str:
        """The result of a tool call the run's time limit cut off; for a sub-agent, what
        the runtime recorded of its findings (its run is ended as failed)."""
        stop = self._time_stop(run_id, agent)
        detail = stop.detail if stop is not None else "its time limit"
        text = NOT_RUN.format(detail=detail)
        if use.name != "spawn_agent":
            return text
        store = env.store
        child = await store.find_child_run(run_id, use.id)
        if child is None:
            return text
        reason = f"stopped: its parent {agent.name} reached {detail}"
        await settle_subtree(store, env.session_id, child.id, "failed", reason)
        findings = await findings_record(store, child.id) or "(nothing yet)"
        return (
            f"Sub-agent run {child.id} was stopped before it reported: its parent reached "
            f"{detail}. What the runtime recorded of its findings:\n{findings}"
        )

    async def charge(self, run: LimitedRun, model: str, usage: Usage) -> None:
        """Count one model call's usage toward the run, its ancestors, the session and
        the tenant.

        Once per model call, so summed in place: no ``Spend`` per call unless a tenant's
        ledger is told it, and the run's ancestors are walked only when some run of the
        session has a budget of its own."""
        tokens = usage_tokens(usage)
        cost = self.prices.cost_usd(model, usage)
        if cost is None:
            cost = 0.0
        state = self._runs.get(run.id) or self._state(run.id)  # (the run's, once attached)
        own, total, last = state.own, self.total, state.last_call
        own.tokens += tokens
        own.cost_usd += cost
        total.tokens += tokens
        total.cost_usd += cost
        last.tokens, last.cost_usd = tokens, cost  # in place: a run keeps no record per call
        if self._agent_budgets:
            for ancestor in self._lineage(run.id):
                if ancestor.scope is not None:
                    ancestor.scope.spent.add_call(tokens, cost)
        if self.session is not None:
            self.session.spent.add_call(tokens, cost)
        if self.tenant is not None and self.ledger is not None:
            spend = Spend(tokens, cost)
            with anyio.CancelScope(shield=True):
                await self.ledger.add_spend(self.tenant, self.session_id, run.id, spend)
            if self.tenant_scope is not None:
                self.tenant_scope.spent.add_call(tokens, cost)

    async def cut_off_run(self, run: LimitedRun) -> TimeoutError:
        """End a run that was still going at its hard deadline (its final report did not
        come in time): failed, with the runtime's record of its findings as its output."""
        store = run.env.store
        stop = self._time_stop(run.id, run.agent) or LimitStop("timeout", "its time limit")
        error = TimeoutError(f"{stop.describe()}; its final report did not come in time")
        with anyio.CancelScope(shield=True):
            findings = await findings_record(store, run.id)
            if (await store.get_run(run.id) or run.record).status == "running":
                await store.finish_run(run.id, "failed", output=findings, error=str(error))
            await settle_subtree(store, run.env.session_id, run.id, "failed", str(error))
        return error

    def deadline(self, run_id: str) -> float:
        state = self._runs.get(run_id)
        return state.deadline if state is not None else math.inf

    def run_spend(self, run_id: str) -> Spend:
        """What a run and everything below it spent."""
        return self._subtree_spend(run_id) if run_id in self._runs else Spend()

    # ------------------------------------------------------------------ checks
    @property
    def reads_ledger(self) -> bool:
        """Whether a budget check reads the tenant's spend from its ledger (an await)."""
        return self.tenant_scope is not None and self.ledger is not None and self.tenant is not None

    async def scopes(self, run_id: str) -> list[BudgetScope]:
        """Every budget the run spends against, the tenant's refreshed from its ledger."""
        if self.tenant_scope is not None and self.ledger is not None and self.tenant is not None:
            since = period_start(self.tenant_scope.budget.per)
            self.tenant_scope.spent = await self.ledger.tenant_spend(self.tenant, since)
        return self._scopes_now(run_id)

    def _scopes_now(self, run_id: str) -> list[BudgetScope]:
        """Every budget the run spends against, as this process knows them now."""
        scopes = (  # the lineage is walked only if some run has a budget of its own
            [s.scope for s in self._lineage(run_id) if s.scope is not None]
            if self._agent_budgets
            else []
        )
        if self.session is not None:
            scopes.append(self.session)
        if self.tenant_scope is not None:
            scopes.append(self.tenant_scope)
        return scopes

    def _next_calls(self, scope: BudgetScope, run_id: str) -> Spend:
        """What going on may cost against ``scope``: for every run now driven under it
        (siblings spend in parallel), this run's included, its next call and then its final
        report, each estimated by its last call."""
        total = Spend()
        for other_id, state in self._runs.items():
            if not (state.driving or other_id == run_id):
                continue
            if scope.name.startswith("agent "):
                if not any(s.scope is scope for s in self._lineage(other_id)):
                    continue
            total.add(state.last_call + state.last_call)
        return total

    def _budget_stop(self, run: LimitedRun, scopes: list[BudgetScope]) -> LimitStop | None:
        for scope in scopes:
            if scope.share(self._next_calls(scope, run.id)) > 1.0 - scope.budget.reserve:
                return LimitStop("budget", f"{scope.label} ({scope.budget.describe()})", scope.name)
        return None

    def _time_stop(self, run_id: str, agent: Agent) -> LimitStop | None:
        state = self._runs.get(run_id)
        if state is None or state.deadline == math.inf or anyio.current_time() < state.deadline:
            return None
        if state.deadline < state.own_deadline:
            return LimitStop("timeout", "the time limit of the agent that started it")
        return LimitStop("timeout", f"its time limit (timeout={agent.timeout:g} seconds)")

    def _turn_or_time_stop(self, run: LimitedRun) -> LimitStop | None:
        if run.turns - run.turn_base >= run.agent.max_turns:
            return LimitStop("max_turns", f"its turn limit (max_turns={run.agent.max_turns})")
        return self._time_stop(run.id, run.agent)

    def only_turns_limit(self, run: LimitedRun) -> bool:
        """Whether ``check`` can stop ``run`` (not yet driven) only at its turn limit: no
        budget, ledger or deadline applies to it or its lineage, so ``check``'s outcome is
        known before the run is attached and stays so while its turns do not change."""
        budget, agent = run.agent.budget, run.agent
        return (
            self.session is None
            and self.tenant_scope is None
            and not self._agent_budgets
            and not (budget is not None and budget.limited)
            and agent.timeout is None
            and self.deadline(run.record.parent_run_id or "") == math.inf
            and run.turns - run.turn_base < agent.max_turns
        )

    async def check(self, run: LimitedRun) -> LimitStop | None:
        """The first limit the run has reached before its next call, if any."""
        stop = self._turn_or_time_stop(run)
        return stop or self._budget_stop(run, await self.scopes(run.id))

    async def next_turn(self, run: LimitedRun) -> TurnNotes:
        """What the user turn that follows a tool turn must carry."""
        stop = self._turn_or_time_stop(run)
        return self._notes(run, stop, [] if stop else await self.scopes(run.id))

    def next_turn_now(self, run: LimitedRun) -> TurnNotes:
        """``next_turn`` without an await, for limits that read no ledger (``reads_ledger``)."""
        if self.reads_ledger:
            raise RuntimeError("the tenant's spend is read from its ledger: use next_turn")
        stop = self._turn_or_time_stop(run)
        return self._notes(run, stop, [] if stop else self._scopes_now(run.id))

    def _notes(
        self, run: LimitedRun, stop: LimitStop | None, scopes: list[BudgetScope]
    ) -> TurnNotes:
        """The stop (``stop``, else a budget's) or the soft-limit notes (each warns once)."""
        if stop is None and scopes:  # (no budget applies: none can stop it)
            stop = self._budget_stop(run, scopes)
        if stop is not None:
            return TurnNotes(stop=stop, notice=run.agent.on_limit == "report")
        if not scopes:  # no budget applies (most sessions): nothing to warn about
            return NO_NOTES
        notes = []
        state = self._state(run.id)
        for scope in scopes:
            share = scope.share()
            if share < scope.budget.soft or scope.budget.soft >= 1.0:
                continue
            if scope.name == "session":
                warned = self._session_warned
            elif state.warned is None:
                warned = state.warned = set()
            else:
                warned = state.warned
            if scope.name in warned:
                continue
            warned.add(scope.name)
            left = spend_left(scope.spent, scope.budget)
            notes.append(
                f"[budget] {scope.label[0].upper()}{scope.label[1:]} is {share:.0%} spent: "
                f"{left} left. Wrap up: finish the most important part of your task and "
                "write your report soon."
            )
            tokens, dollars = _remaining_tokens(scope), _remaining_usd(scope)
            run.env.tracing.limit_soft(
                scope=scope.name, share=share, remaining_tokens=tokens, remaining_usd=dollars
            )
            run.events.emit(
                ev.LimitWarning,
                scope=scope.name,
                spent_share=share,
                remaining_tokens=tokens,
                remaining_usd=dollars,
            )
        return TurnNotes(notes=tuple(notes)) if notes else NO_NOTES

    async def spawn_refusal(self, run_id: str, role: Agent) -> str | None:
        """Why a new child of run ``run_id`` may not start (no budget left), or None."""
        for scope in await self.scopes(run_id):
            if scope.share() >= 1.0 - scope.budget.reserve:
                return (
                    f"Cannot spawn {role.name}: {scope.label} is used up "
                    f"({spend_left(scope.spent, scope.budget)} left, the rest is kept for final "
                    "reports). Write your answer with what you have."
                )
        return None

    async def start_refusal(self) -> str | None:
        """Why a new run of this session may not start at all, or None."""
        scopes = [s for s in (self.session, self.tenant_scope) if s is not None]
        for scope in scopes:
            if scope is self.tenant_scope and self.ledger is not None and self.tenant:
                since = period_start(scope.budget.per)
                scope.spent = await self.ledger.tenant_spend(self.tenant, since)
            if scope.share() >= 1.0 - scope.budget.reserve:
                return (
                    f"{scope.label} is used up: {spend_left(scope.spent, scope.budget)} left "
                    f"of {scope.budget.describe()}"
                )
        return None

    async def remaining(self, run_id: str) -> tuple[int | None, float | None]:
        """The least tokens and dollars left under any budget the run spends against."""
        scopes = await self.scopes(run_id)
        tokens = [t for s in scopes if (t := _remaining_tokens(s)) is not None]
        dollars = [d for s in scopes if (d := _remaining_usd(s)) is not None]
        return (min(tokens) if tokens else None, min(dollars) if dollars else None)


def _remaining_tokens(scope: BudgetScope) -> int | None:
    limit = scope.budget.max_tokens
    return None if limit is None else max(limit - scope.spent.tokens, 0)


def _remaining_usd(scope: BudgetScope) -> float | None:
    limit = scope.budget.max_cost_usd
    return None if limit is None else round(max(limit - scope.spent.cost_usd, 0.0), 6)


def session_limits(env: Environment) -> SessionLimits:
    """The session's limits (a session without budgets gets an empty ledger)."""
    limits = env.extras.get("limits")
    if not isinstance(limits, SessionLimits):
        limits = SessionLimits(session_id=env.session_id)
        env.extras["limits"] = limits
    return limits


def continue_notice(stopped: RunRecord, budget: Budget | None) -> str:
    """The user turn that continues a run a limit stopped, under a new budget."""
    _, why = parse_stop(stopped.error)
    new = f" You now have a new budget ({budget.describe()})." if budget is not None else ""
    return (
        f"[limit raised] Your work was {why or 'stopped by a limit'}.{new} Continue your task "
        "where you left off (you can call tools again), then give your final answer."
    )
