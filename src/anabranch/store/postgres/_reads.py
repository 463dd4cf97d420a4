"""The reads of ``PostgresStore``: each one statement on the reader connection."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from anabranch.store._records import (
    BoundaryRecord,
    CallRecord,
    CallUsageSum,
    ContextLimitRecord,
    HistoryHit,
    MessageRecord,
    RunRecord,
    SessionBudgetRecord,
    SessionRecord,
    SnapshotRecord,
    SpendTotal,
    SpillRecord,
    ToolEventRecord,
)
from anabranch.store._results import history_hits, spill_record
from anabranch.store.postgres._connection import Conn, Connections
from anabranch.store.postgres._schema import TEXT_SEARCH_CONFIG

__all__ = ["Reads"]

_RUN_COLUMNS = (
    "r.id, r.session_id, r.parent_run_id, r.parent_call_id, r.task_id, r.agent_name, r.model, "
    "r.depth, r.mode, r.created"
)
_BOUNDARY_COLUMNS = ", ".join(
    name for name in BoundaryRecord.__dataclass_fields__ if name != "details"
)
_TS = f"'{TEXT_SEARCH_CONFIG}'::regconfig"
_HEADLINE = "StartSel=[, StopSel=], MaxWords=16, MinWords=4, MaxFragments=1, FragmentDelimiter=…"


class Reads:
    """Read methods over a ``Connections``; ``PostgresStore`` adds the writes."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections

    async def _all(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        def run(conn: Conn) -> list[dict[str, Any]]:
            return conn.execute(sql, tuple(params)).fetchall()

        return await self._connections.read(run)

    async def _one(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any] | None:
        rows = await self._all(sql, params)
        return rows[0] if rows else None

    # ----------------------------------------------------------------- sessions
    _SESSION_SQL = """
        SELECT s.id, s.created, s.kind, s.entry, s.task, s.source, s.definition,
               e.status, e.output, e.error,
               CASE WHEN e.status = 'running' THEN NULL ELSE e.created END AS finished
        FROM sessions s
        CROSS JOIN LATERAL (
            SELECT status, output, error, created FROM session_events
            WHERE session_id = s.id ORDER BY id DESC LIMIT 1) e
    """

    async def get_session(self, session_id: str) -> SessionRecord | None:
        row = await self._one(self._SESSION_SQL + " WHERE s.id = %s", (session_id,))
        return SessionRecord(**row) if row else None

    async def list_sessions(self, limit: int = 100) -> list[SessionRecord]:
        rows = await self._all(self._SESSION_SQL + " ORDER BY s.created DESC LIMIT %s", (limit,))
        return [SessionRecord(**row) for row in rows]

    # ----------------------------------------------------------------- runs
    _RUN_SQL = f"""
        SELECT {_RUN_COLUMNS}, COALESCE(e.status, 'running') AS status,
               CASE WHEN e.status = 'running' THEN NULL ELSE e.output END AS output,
               CASE WHEN e.status = 'running' THEN NULL ELSE e.error END AS error,
               CASE WHEN e.status = 'running' THEN NULL ELSE e.finished END AS finished
        FROM runs r LEFT JOIN LATERAL (
            SELECT status, output, error, finished FROM run_ends
            WHERE run_id = r.id ORDER BY id DESC LIMIT 1) e ON true
    """

    async def get_run(self, run_id: str) -> RunRecord | None:
        row = await self._one(self._RUN_SQL + " WHERE r.id = %s", (run_id,))
        return RunRecord(**row) if row else None

    async def list_runs(self, session_id: str) -> list[RunRecord]:
        rows = await self._all(
            self._RUN_SQL + " WHERE r.session_id = %s ORDER BY r.created, r.ord", (session_id,)
        )
        return [RunRecord(**row) for row in rows]

    async def find_child_run(self, parent_run_id: str, parent_call_id: str) -> RunRecord | None:
        row = await self._one(
            self._RUN_SQL + " WHERE r.parent_run_id = %s AND r.parent_call_id = %s",
            (parent_run_id, parent_call_id),
        )
        return RunRecord(**row) if row else None

    # ----------------------------------------------------------------- messages
    async def load_messages(
        self, run_id: str, *, from_seq: int = 0, to_seq: int | None = None
    ) -> list[MessageRecord]:
        sql = (
            "SELECT id, run_id, seq, role, content, kind, created FROM messages "
            "WHERE run_id = %s AND seq >= %s"
        )
        params: list[Any] = [run_id, from_seq]
        if to_seq is not None:
            sql += " AND seq <= %s"
            params.append(to_seq)
        rows = await self._all(sql + " ORDER BY seq", params)
        return [MessageRecord(**row) for row in rows]

    async def next_seq(self, run_id: str) -> int:
        row = await self._one(
            "SELECT seq FROM messages WHERE run_id = %s ORDER BY seq DESC LIMIT 1", (run_id,)
        )
        return int(row["seq"]) + 1 if row else 0

    # ----------------------------------------------------------------- calls
    _CALL_SQL = """
        SELECT c.id, c.run_id, c.turn, c.attempt, c.fingerprint, c.message_count, c.created,
               c.snapshot_version, c.compactions, c.settings, o.status, o.error_type, o.error,
               o.response_id, o.model, o.stop_reason, o.usage, o.message_seq,
               o.created AS finished
        FROM calls c LEFT JOIN call_outcomes o ON o.call_id = c.id
    """

    async def list_calls(self, run_id: str) -> list[CallRecord]:
        rows = await self._all(self._CALL_SQL + " WHERE c.run_id = %s ORDER BY c.id", (run_id,))
        return [CallRecord(**row) for row in rows]

    async def recent_ok_calls(self, run_id: str, *, up_to: int, limit: int = 2) -> list[CallRecord]:
        """The run's last ``limit`` successful calls with id <= ``up_to``, newest first."""
        rows = await self._all(
            self._CALL_SQL + " WHERE c.run_id = %s AND c.id <= %s AND o.status = 'ok'"
            " ORDER BY c.turn DESC, c.id DESC LIMIT %s",
            (run_id, up_to, limit),
        )
        return [CallRecord(**row) for row in rows]

    async def last_call(self, run_id: str, *, ok: bool = False) -> CallRecord | None:
        """The run's latest call (with ``ok``: latest successful one)."""
        status = " AND o.status = 'ok'" if ok else ""
        row = await self._one(
            self._CALL_SQL
            + f" WHERE c.run_id = %s{status} ORDER BY c.turn DESC, c.id DESC LIMIT 1",
            (run_id,),
        )
        return CallRecord(**row) if row else None

    async def count_calls(self, run_id: str, status: str = "ok") -> int:
        """How many of the run's call attempts ended with ``status`` (no rows loaded)."""
        row = await self._one(
            "SELECT COUNT(*) AS n FROM calls c JOIN call_outcomes o ON o.call_id = c.id "
            "WHERE c.run_id = %s AND o.status = %s",
            (run_id, status),
        )
        return int(row["n"]) if row else 0

    async def last_ok_turn(self, run_id: str) -> int:
        """The turn of the run's latest successful call (0 if none)."""
        row = await self._one(
            "SELECT c.turn FROM calls c JOIN call_outcomes o ON o.call_id = c.id "
            "WHERE c.run_id = %s AND o.status = 'ok' ORDER BY c.turn DESC, c.id DESC LIMIT 1",
            (run_id,),
        )
        return int(row["turn"]) if row else 0

    async def sum_call_usage(
        self, session_id: str, keys: Sequence[str], *, run_id: str | None = None
    ) -> dict[str, int]:
        """Sums of integer ``keys`` of the usage JSON of the session's (or run's) successful
        calls, computed in SQL."""
        sql = f"SELECT {_usage_sums(keys)} {_OK_USAGE} AND "
        if run_id is not None:
            sql += "c.run_id = %s"
            params: tuple[str, ...] = (run_id,)
        else:
            sql += "c.run_id IN (SELECT id FROM runs WHERE session_id = %s)"
            params = (session_id,)
        row = await self._one(sql, params) if keys else {}
        return {key: int((row or {}).get(key) or 0) for key in keys}

    async def call_usage_by_run(
        self, session_id: str, keys: Sequence[str], *, up_to: int | None = None
    ) -> list[CallUsageSum]:
        sums = f", {_usage_sums(keys)}" if keys else ""
        bound = "" if up_to is None else " AND c.id <= %s"
        rows = await self._all(
            f"SELECT c.run_id, o.model{sums} {_OK_USAGE} "
            f"AND c.run_id IN (SELECT id FROM runs WHERE session_id = %s){bound} "
            "GROUP BY c.run_id, o.model ORDER BY c.run_id, COALESCE(o.model, '')",
            (session_id,) if up_to is None else (session_id, up_to),
        )
        return [
            CallUsageSum(
                run_id=row["run_id"],
                model=row["model"],
                sums={key: int(row[key] or 0) for key in keys},
            )
            for row in rows
        ]

    async def last_call_id(self) -> int:
        row = await self._one("SELECT COALESCE(max(id), 0) AS id FROM calls")
        return int(row["id"]) if row else 0

    async def session_calls(self, session_id: str) -> list[CallRecord]:
        rows = await self._all(
            self._CALL_SQL
            + " WHERE c.run_id IN (SELECT id FROM runs WHERE session_id = %s) ORDER BY c.id",
            (session_id,),
        )
        return [CallRecord(**row) for row in rows]

    # ----------------------------------------------------------------- tools
    async def tool_events(self, run_id: str, call_ids: Sequence[str]) -> list[ToolEventRecord]:
        if not call_ids:
            return []
        rows = await self._all(
            "SELECT id, run_id, call_id, name, event, content, is_error, created, attachments "
            "FROM tool_events "
            "WHERE run_id = %s AND call_id = ANY(%s) ORDER BY id",
            (run_id, list(call_ids)),
        )
        return [ToolEventRecord(**row) for row in rows]

    async def session_tool_events(
        self, session_id: str, events: Sequence[str]
    ) -> list[ToolEventRecord]:
        if not events:
            return []
        rows = await self._all(
            "SELECT id, run_id, call_id, name, event, content, is_error, created, attachments "
            "FROM tool_events WHERE event = ANY(%s) AND run_id IN "
            "(SELECT id FROM runs WHERE session_id = %s) ORDER BY id",
            (list(events), session_id),
        )
        return [ToolEventRecord(**row) for row in rows]

    # ----------------------------------------------------------------- snapshots
    _SNAPSHOT_SQL = "SELECT id, run_id, version, reason, system, tools, created FROM snapshots"

    async def latest_snapshot(self, run_id: str) -> SnapshotRecord | None:
        row = await self._one(
            self._SNAPSHOT_SQL + " WHERE run_id = %s ORDER BY version DESC LIMIT 1", (run_id,)
        )
        return SnapshotRecord(**row) if row else None

    async def get_snapshot(self, run_id: str, version: int) -> SnapshotRecord | None:
        row = await self._one(
            self._SNAPSHOT_SQL + " WHERE run_id = %s AND version = %s", (run_id, version)
        )
        return SnapshotRecord(**row) if row else None

    async def list_snapshots(self, run_id: str) -> list[SnapshotRecord]:
        """Every snapshot of a run, oldest first."""
        rows = await self._all(
            self._SNAPSHOT_SQL + " WHERE run_id = %s ORDER BY version", (run_id,)
        )
        return [SnapshotRecord(**row) for row in rows]

    # ----------------------------------------------------------------- boundaries
    _BOUNDARY_SQL = f"SELECT {_BOUNDARY_COLUMNS} FROM boundaries"

    async def list_boundaries(
        self, *, run_id: str | None = None, session_id: str | None = None
    ) -> list[BoundaryRecord]:
        if run_id is not None:
            sql, params = self._BOUNDARY_SQL + " WHERE run_id = %s ORDER BY id", (run_id,)
        else:
            sql = (
                self._BOUNDARY_SQL + " WHERE run_id IN "
                "(SELECT id FROM runs WHERE session_id = %s) ORDER BY id"
            )
            params = (session_id or "",)
        return [BoundaryRecord(**row) for row in await self._all(sql, params)]

    async def get_boundary(self, boundary_id: int) -> BoundaryRecord | None:
        row = await self._one(self._BOUNDARY_SQL + " WHERE id = %s", (boundary_id,))
        return BoundaryRecord(**row) if row else None

    async def count_boundaries(self, run_id: str, status: str = "ok") -> int:
        row = await self._one(
            "SELECT COUNT(*) AS n FROM boundaries WHERE run_id = %s AND status = %s",
            (run_id, status),
        )
        return int(row["n"]) if row else 0

    async def latest_boundary(self, run_id: str) -> BoundaryRecord | None:
        row = await self._one(
            self._BOUNDARY_SQL + " WHERE run_id = %s AND status = 'ok' ORDER BY id DESC LIMIT 1",
            (run_id,),
        )
        return BoundaryRecord(**row) if row else None

    # ----------------------------------------------------------------- spills
    async def get_spill(self, handle: str) -> str | None:
        spill = await self.get_spill_record(handle)
        return spill.content if spill else None

    async def get_spill_record(self, handle: str) -> SpillRecord | None:
        """The spill behind ``handle`` with the run that saved it.

        Raises:
            StoreError: the spill refers to a tool event that is not stored.
        """
        row = await self._one(
            "SELECT s.handle, s.run_id, s.call_id, coalesce(s.content, t.content) AS content, "
            "s.created, s.event_id FROM spills s LEFT JOIN tool_events t ON t.id = s.event_id "
            "WHERE s.handle = %s",
            (handle,),
        )
        return spill_record(handle, row) if row is not None else None

    # ----------------------------------------------------------------- history search
    async def search_history(self, run_id: str, text: str, limit: int = 5) -> list[HistoryHit]:
        """Full-text matches of ``text``'s words in one run's original messages and spills.

        Every word must match; if nothing does, any word may. Best matches first.
        """
        words = re.findall(r"\w+", text)
        if not words:
            return []
        rows = await self._search(run_id, words, " && ", limit)
        if not rows and len(words) > 1:
            rows = await self._search(run_id, words, " || ", limit)
        return history_hits(rows)

    async def _search(
        self, run_id: str, words: list[str], joiner: str, limit: int
    ) -> list[dict[str, Any]]:
        query = joiner.join(f"plainto_tsquery({_TS}, %s)" for _ in words)
        message_vector = f"to_tsvector({_TS}, message_text(m.run_id, m.content))"
        spill_text = "spill_text(s.event_id, s.content)"
        spill_vector = f"to_tsvector({_TS}, {spill_text})"
        sql = f"""
            WITH q AS (SELECT ({query}) AS q)
            SELECT * FROM (
                SELECT 'message' AS source, m.seq::text AS ref,
                       ts_headline({_TS}, message_text(m.run_id, m.content), q.q, %s) AS snippet,
                       ts_rank({message_vector}, q.q) AS rank
                FROM messages m, q
                WHERE m.run_id = %s AND m.kind = 'message' AND {message_vector} @@ q.q
                UNION ALL
                SELECT 'spill', s.handle, ts_headline({_TS}, {spill_text}, q.q, %s),
                       ts_rank({spill_vector}, q.q)
                FROM spills s, q
                WHERE s.run_id = %s AND {spill_vector} @@ q.q
            ) hits ORDER BY rank DESC LIMIT %s
        """
        return await self._all(sql, (*words, _HEADLINE, run_id, _HEADLINE, run_id, limit))

    # ----------------------------------------------------------------- context limits
    _LIMIT_SQL = (
        'SELECT model, channel, maximum, ratio, "window", source, created, run_id '
        "FROM context_limits"
    )

    async def context_limit(self, model: str, channel: str) -> ContextLimitRecord | None:
        """The latest limit taught for ``model`` on ``channel`` (rows without a run)."""
        row = await self._one(
            self._LIMIT_SQL + " WHERE model = %s AND channel = %s AND run_id IS NULL "
            "ORDER BY id DESC LIMIT 1",
            (model, channel),
        )
        return ContextLimitRecord(**row) if row else None

    async def run_context_limits(self, session_id: str) -> list[ContextLimitRecord]:
        """The limits the session's runs started with or learned, oldest first."""
        rows = await self._all(
            self._LIMIT_SQL + " WHERE run_id IN (SELECT id FROM runs WHERE session_id = %s) "
            "ORDER BY id",
            (session_id,),
        )
        return [ContextLimitRecord(**row) for row in rows]

    # ----------------------------------------------------------------- budgets
    async def tenant_spend(self, tenant: str, since: float) -> SpendTotal:
        """The tenant's spend recorded at or after ``since``, summed in the database."""
        row = await self._one(
            "SELECT COALESCE(SUM(tokens), 0) AS tokens, COALESCE(SUM(cost_usd), 0.0) AS cost "
            "FROM tenant_spend WHERE tenant = %s AND created >= %s",
            (tenant, since),
        )
        assert row is not None
        return SpendTotal(tokens=int(row["tokens"]), cost_usd=float(row["cost"]))

    async def session_budget(self, session_id: str) -> SessionBudgetRecord | None:
        """The latest budget record of the session, if it has one."""
        row = await self._one(
            "SELECT session_id, created, tenant, budget, tenant_budget FROM session_budgets "
            "WHERE session_id = %s ORDER BY id DESC LIMIT 1",
            (session_id,),
        )
        return SessionBudgetRecord(**row) if row else None

    # ----------------------------------------------------------------- cache breaks, spans
    async def list_cache_breaks(self, session_id: str) -> list[dict[str, Any]]:
        return await self._all(
            "SELECT id, run_id, call_id, cause, expected_read, actual_read, created "
            "FROM cache_breaks WHERE run_id IN (SELECT id FROM runs WHERE session_id = %s) "
            "ORDER BY id",
            (session_id,),
        )

    async def run_spans(self, run_id: str, limit: int | None = None) -> list[tuple[str, str]]:
        """``(trace_id, span_id)`` of the earlier drives of a run (the latest ``limit`` of
        them, if given), oldest first."""
        sql = "SELECT trace_id, span_id FROM run_spans WHERE run_id = %s ORDER BY id DESC"
        params: tuple[Any, ...] = (run_id,)
        if limit is not None:
            sql += " LIMIT %s"
            params = (run_id, limit)
        rows = await self._all(sql, params)
        return [(str(r["trace_id"]), str(r["span_id"])) for r in reversed(rows)]

    async def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Read-only SQL for reports and tools (``SELECT`` only, in a read-only transaction)."""
        if not sql.lstrip().upper().startswith(("SELECT", "WITH")):
            raise ValueError("query() runs SELECT statements only")

        def run(conn: Conn) -> list[dict[str, Any]]:
            with conn.transaction():
                conn.execute("SET TRANSACTION READ ONLY")
                return conn.execute(sql, tuple(params)).fetchall()

        return await self._connections.read(run)


_OK_USAGE = (
    "FROM calls c JOIN call_outcomes o ON o.call_id = c.id "
    "WHERE o.status = 'ok' AND o.usage IS NOT NULL"
)


def _usage_sums(keys: Sequence[str]) -> str:
    """``SUM`` columns of the usage JSON's ``keys``, named by them (checked: they are
    spliced into SQL)."""
    for key in keys:
        if not key.isidentifier():
            raise ValueError(f"not a usage key: {key!r}")
    return ", ".join(
        f"COALESCE(SUM((o.usage::jsonb ->> '{key}')::bigint), 0) AS {key}" for key in keys
    )
