"""Queries of the ``context_limits`` table: what each channel taught, and each run's limit."""

from __future__ import annotations

from dataclasses import asdict

from anabranch.store._records import ContextLimitRecord
from anabranch.store.sqlite._group_commit import GroupCommitConnection
from anabranch.store.sqlite._rows import fetch_rows, insert

__all__ = ["SQLiteContextLimits"]

_COLUMNS = "model, channel, maximum, ratio, window, source, created, run_id"


class SQLiteContextLimits:
    """Mixed into ``SQLiteStore``: context limits per (model, channel) and per run."""

    _sql: GroupCommitConnection

    async def save_context_limit(self, limit: ContextLimitRecord) -> None:
        values = asdict(limit)
        await self._sql.write(lambda conn: insert(conn, "context_limits", values))

    async def context_limit(self, model: str, channel: str) -> ContextLimitRecord | None:
        rows = await self._sql.lookup(
            lambda conn: fetch_rows(
                conn,
                f"SELECT {_COLUMNS} FROM context_limits WHERE model = ? AND channel = ? "
                "AND run_id IS NULL ORDER BY id DESC LIMIT 1",
                (model, channel),
            )
        )
        return ContextLimitRecord(**rows[0]) if rows else None

    async def run_context_limits(self, session_id: str) -> list[ContextLimitRecord]:
        rows = await self._sql.read(
            lambda conn: fetch_rows(
                conn,
                f"SELECT {_COLUMNS} FROM context_limits WHERE run_id IN "
                "(SELECT id FROM runs WHERE session_id = ?) ORDER BY id",
                (session_id,),
            )
        )
        return [ContextLimitRecord(**row) for row in rows]
