"""Where the budgets of a session come from: the ``run``/``resume`` arguments, the
session's record in the store, the runtime's tenant budgets; and where tenants' spend
goes (the store, so every process on it shares one budget)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from anabranch.agents import Budget
from anabranch.context._pricing import PriceTable
from anabranch.errors import BudgetExceeded, UserError
from anabranch.runtime._run_limits import SessionLimits, Spend
from anabranch.store import SessionBudgetRecord, SpendRecord, Store

__all__ = [
    "StoreLedger",
    "check_budget",
    "check_tenant_budgets",
    "open_limits",
    "refuse_continue",
    "refuse_start",
]


class StoreLedger:
    """Tenants' spend kept in the store (``TenantLedger``)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def tenant_spend(self, tenant: str, since: float) -> Spend:
        total = await self._store.tenant_spend(tenant, since)
        return Spend(total.tokens, total.cost_usd)

    async def add_spend(self, tenant: str, session_id: str, run_id: str, spend: Spend) -> None:
        record = SpendRecord(tenant, session_id, run_id, spend.tokens, spend.cost_usd, time.time())
        await self._store.add_spend(record)


def check_tenant_budgets(budgets: Mapping[str, Budget] | None) -> dict[str, Budget]:
    """``Runtime(budgets=...)`` checked: tenant names to budgets."""
    checked: dict[str, Budget] = {}
    for tenant, budget in (budgets or {}).items():
        if not isinstance(tenant, str) or not tenant.strip():
            raise UserError(f"a tenant name must be a non-empty string, got {tenant!r}")
        if not isinstance(budget, Budget):
            raise UserError(f"the budget of tenant {tenant!r} must be a Budget")
        checked[tenant] = budget
    return checked


def check_budget(budget: Budget | None, tenant: str | None = None) -> None:
    """A run's ``budget`` and ``tenant`` arguments, or a clear error."""
    if budget is not None and not isinstance(budget, Budget):
        raise UserError(f"budget must be a Budget, got {type(budget).__name__}")
    if budget is not None and budget.per is not None:
        raise UserError(
            "a session's budget is per run: per= applies to tenant budgets (Runtime(budgets={...}))"
        )
    if tenant is not None and (not isinstance(tenant, str) or not tenant.strip()):
        raise UserError("tenant must be a non-empty string")


async def open_limits(
    store: Store,
    session_id: str,
    budget: Budget | None,
    tenant: str | None,
    fresh: bool,
    tenant_budgets: Mapping[str, Budget],
    prices: PriceTable,
) -> SessionLimits:
    """The limits of a new (``fresh``) or continued session. A new session's budget and
    tenant are recorded; a continued one keeps what it had, except for a new ``budget``
    (recorded too), and its spend so far counts against it."""
    if not fresh:
        stored = await store.session_budget(session_id)
        if stored is not None:
            tenant = stored.tenant
            if budget is None and stored.budget is not None:
                budget = Budget.model_validate_json(stored.budget)
    tenant_budget = tenant_budgets.get(tenant) if tenant is not None else None
    if (fresh and (budget is not None or tenant is not None)) or (not fresh and budget):
        await store.set_session_budget(
            SessionBudgetRecord(
                session_id=session_id,
                created=time.time(),
                tenant=tenant,
                budget=budget.model_dump_json() if budget is not None else None,
                tenant_budget=tenant_budget.model_dump_json() if tenant_budget else None,
            )
        )
    limits = SessionLimits(
        session_id=session_id,
        budget=budget,
        tenant=tenant,
        tenant_budget=tenant_budget,
        ledger=StoreLedger(store),
        prices=prices,
    )
    if not fresh:
        await limits.load(store, session_id)
    return limits


async def refuse_start(
    store: Store,
    what: str,
    budget: Budget | None,
    tenant: str | None,
    tenant_budgets: Mapping[str, Budget],
) -> None:
    """Raise ``BudgetExceeded`` if a new session may not start (its tenant's budget is
    used up)."""
    probe = SessionLimits(
        budget=budget,
        tenant=tenant,
        tenant_budget=tenant_budgets.get(tenant) if tenant is not None else None,
        ledger=StoreLedger(store),
    )
    refusal = await probe.start_refusal()
    if refusal is not None:
        raise BudgetExceeded(f"cannot start {what}: {refusal}")


async def refuse_continue(limits: object, session_id: str) -> None:
    """Raise ``BudgetExceeded`` if a stopped session's new budget leaves nothing to go on."""
    assert isinstance(limits, SessionLimits)
    refusal = await limits.start_refusal()
    if refusal is not None:
        raise BudgetExceeded(f"cannot continue session {session_id}: {refusal}")
