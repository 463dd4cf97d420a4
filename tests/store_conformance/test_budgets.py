"""Budgets: tenants' spend and sessions' budgets, shared by every store on the database."""

from __future__ import annotations

import pytest

from anabranch.store import SessionBudgetRecord, SpendRecord, SpendTotal, Store
from tests.store_conformance.conftest import Backend, add_session

pytestmark = pytest.mark.anyio


async def test_tenant_spend_is_summed_since_a_time_across_stores(backend: Backend) -> None:
    one, two = await backend.open(), await backend.open()
    assert await one.tenant_spend("acme", 0.0) == SpendTotal()
    await one.add_spend(SpendRecord("acme", "ses_1", "run_1", 100, 0.5, created=1_000.0))
    await two.add_spend(SpendRecord("acme", "ses_2", "run_2", 250, 1.25, created=2_000.0))
    await two.add_spend(SpendRecord("other", "ses_3", "run_3", 999, 9.0, created=2_000.0))
    total = await one.tenant_spend("acme", 0.0)
    assert total.tokens == 350 and total.cost_usd == pytest.approx(1.75)
    since = await two.tenant_spend("acme", 1_500.0)
    assert since.tokens == 250 and since.cost_usd == pytest.approx(1.25)
    assert await one.tenant_spend("nobody", 0.0) == SpendTotal()


async def test_the_latest_session_budget_wins(store: Store) -> None:
    await add_session(store)
    assert await store.session_budget("ses_1") is None
    first = SessionBudgetRecord("ses_1", 1.0, tenant="acme", budget='{"max_tokens":10}')
    await store.set_session_budget(first)
    assert await store.session_budget("ses_1") == first
    second = SessionBudgetRecord("ses_1", 2.0, tenant="acme", budget='{"max_tokens":20}')
    await store.set_session_budget(second)
    assert await store.session_budget("ses_1") == second
    assert await store.session_budget("ses_2") is None
