"""The budget half of the SQLite store: tenants' spend and sessions' budgets."""

from __future__ import annotations

from dataclasses import asdict

from anabranch.store._records import SessionBudgetRecord, SpendRecord, SpendTotal
from anabranch.store.sqlite._group_commit import GroupCommitConnection
from anabranch.store.sqlite._rows import fetch_rows, insert

__all__ = ["SQLiteBudgets"]


class SQLiteBudgets:
    """Budget queries on the store's group-committed connection (a mixin)."""

    _sql: GroupCommitConnection

    async def add_spend(self, spend: SpendRecord) -> None:
        values = asdict(spend)
        await self._sql.write(lambda conn: insert(conn, "tenant_spend", values))

    async def tenant_spend(self, tenant: str, since: float) -> SpendTotal:
        rows = await self._sql.read(
            lambda conn: fetch_rows(
                conn,
                "SELECT COALESCE(SUM(tokens), 0) AS tokens, COALESCE(SUM(cost_usd), 0.0) "
                "AS cost_usd FROM tenant_spend WHERE tenant = ? AND created >= ?",
                (tenant, since),
            )
        )
        row = rows[0]
        return SpendTotal(tokens=int(row["tokens"]), cost_usd=float(row["cost_usd"]))

    async def set_session_budget(self, record: SessionBudgetRecord) -> None:
        values = asdict(record)
        await self._sql.write(lambda conn: insert(conn, "session_budgets", values))

    async def session_budget(self, session_id: str) -> SessionBudgetRecord | None:
        rows = await self._sql.lookup(
            lambda conn: fetch_rows(
                conn,
                "SELECT session_id, created, tenant, budget, tenant_budget "
                "FROM session_budgets WHERE session_id = ? ORDER BY id DESC LIMIT 1",
                (session_id,),
            )
        )
        return SessionBudgetRecord(**rows[0]) if rows else None
