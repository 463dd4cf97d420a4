"""``SQLiteHistory``: the reads of a run's history from the SQLite store: messages, calls
and their usage, tool events, snapshots, boundaries, spills and full-text search (the
writes of them are ``SQLiteHistoryWrites``; ``SQLiteStore`` adds sessions, leases, runs)."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from typing import Any

from anabranch.store._records import (
    BoundaryRecord,
    CallRecord,
    CallUsageSum,
    HistoryHit,
    MessageRecord,
    SnapshotRecord,
    SpillRecord,
    ToolEventRecord,
)
from anabranch.store._results import history_hits, spill_record
from anabranch.store.sqlite._group_commit import GroupCommitConnection
from anabranch.store.sqlite._rows import (
    CALL_SQL,
    OK_USAGE,
    call_record,
    fetch_rows,
    tool_event_record,
    usage_sums,
)

__all__ = ["SQLiteHistory"]

_SPILL_SQL = """
    SELECT s.handle, s.run_id, s.call_id, COALESCE(s.content, t.content) AS content,
           s.created, s.event_id
    FROM spills s LEFT JOIN tool_events t ON t.id = s.event_id WHERE s.handle = ?
"""
"""A spill with its text (read from its tool event if it refers to one)."""


class SQLiteHistory:
    """Queries over a run's history on one group-committed SQLite connection."""

    def __init__(self, sql: GroupCommitConnection) -> None:
        self._sql = sql

    # ----------------------------------------------------------------- messages & calls
    async def load_messages(
        self, run_id: str, *, from_seq: int = 0, to_seq: int | None = None
    ) -> list[MessageRecord]:
        sql = "SELECT * FROM messages WHERE run_id = ? AND seq >= ?"
        params: list[Any] = [run_id, from_seq]
        if to_seq is not None:
            sql += " AND seq <= ?"
            params.append(to_seq)
        rows = await self._sql.read(lambda conn: fetch_rows(conn, sql + " ORDER BY seq", params))
        return [MessageRecord(**row) for row in rows]

    async def next_seq(self, run_id: str) -> int:
        row = await self._sql.lookup(
            lambda conn: conn.execute(
                "SELECT COALESCE(MAX(seq), -1) FROM messages WHERE run_id = ?", (run_id,)
            ).fetchone()
        )
        return int(row[0]) + 1

    async def list_calls(self, run_id: str) -> list[CallRecord]:
        rows = await self._sql.read(
            lambda conn: fetch_rows(conn, CALL_SQL + " WHERE c.run_id = ? ORDER BY c.id", (run_id,))
        )
        return [call_record(row) for row in rows]

    async def recent_ok_calls(self, run_id: str, *, up_to: int, limit: int = 2) -> list[CallRecord]:
        """The run's last ``limit`` successful calls with id <= ``up_to``, newest first.

        A run's calls are numbered by turn in id order (a retry keeps its turn), so walking
        the (run_id, turn) index backwards is id order: no sort of the run's whole history.
        """
        rows = await self._sql.lookup(
            lambda conn: fetch_rows(
                conn,
                CALL_SQL + " WHERE c.run_id = ? AND c.id <= ? AND o.status = 'ok'"
                " ORDER BY c.turn DESC, c.id DESC LIMIT ?",
                (run_id, up_to, limit),
            )
        )
        return [call_record(row) for row in rows]

    async def last_call(self, run_id: str, *, ok: bool = False) -> CallRecord | None:
        """The run's latest call (with ``ok``: latest successful one), read from the end of
        the (run_id, turn) index: a run's calls are numbered by turn in id order."""
        status = " AND o.status = 'ok'" if ok else ""
        rows = await self._sql.lookup(
            lambda conn: fetch_rows(
                conn,
                CALL_SQL + f" WHERE c.run_id = ?{status} ORDER BY c.turn DESC, c.id DESC LIMIT 1",
                (run_id,),
            )
        )
        return call_record(rows[0]) if rows else None

    async def count_calls(self, run_id: str, status: str = "ok") -> int:
        """How many of the run's call attempts ended with ``status`` (no rows loaded)."""
        row = await self._sql.lookup(
            lambda conn: conn.execute(
                "SELECT COUNT(*) FROM calls c JOIN call_outcomes o ON o.call_id = c.id "
                "WHERE c.run_id = ? AND o.status = ?",
                (run_id, status),
            ).fetchone()
        )
        return int(row[0])

    async def last_ok_turn(self, run_id: str) -> int:
        """The turn of the run's latest successful call (0 if none). A run's successful calls
        are turns 1..n, so this is their count, read from the end of the (run_id, turn)
        index instead of counting the whole history."""
        row = await self._sql.lookup(
            lambda conn: conn.execute(
                "SELECT c.turn FROM calls c JOIN call_outcomes o ON o.call_id = c.id "
                "WHERE c.run_id = ? AND o.status = 'ok' ORDER BY c.turn DESC, c.id DESC LIMIT 1",
                (run_id,),
            ).fetchone()
        )
        return int(row[0]) if row else 0

    async def sum_call_usage(
        self, session_id: str, keys: Sequence[str], *, run_id: str | None = None
    ) -> dict[str, int]:
        """Sums of integer ``keys`` of the usage JSON of the session's (or run's) successful
        calls, computed in SQL: a long session's usage costs no rows in Python."""
        sql = f"SELECT {usage_sums(keys)} {OK_USAGE} AND "
        if run_id is not None:
            sql += "c.run_id = ?"
            params: tuple[str, ...] = (run_id,)
        else:
            sql += "c.run_id IN (SELECT id FROM runs WHERE session_id = ?)"
            params = (session_id,)
        # a small session's sum on the loop's thread, a long one's on the worker thread
        row = await self._sql.bounded_lookup(lambda conn: conn.execute(sql, params).fetchone())
        return {key: int(value) for key, value in zip(keys, row, strict=True)}

    async def call_usage_by_run(
        self, session_id: str, keys: Sequence[str], *, up_to: int | None = None
    ) -> list[CallUsageSum]:
        bound = "" if up_to is None else " AND c.id <= ?"
        sql = (
            f"SELECT c.run_id, o.model, {usage_sums(keys)} {OK_USAGE} "
            f"AND c.run_id IN (SELECT id FROM runs WHERE session_id = ?){bound} "
            "GROUP BY c.run_id, o.model ORDER BY c.run_id, COALESCE(o.model, '')"
        )
        params = (session_id,) if up_to is None else (session_id, up_to)
        rows = await self._sql.bounded_lookup(lambda conn: conn.execute(sql, params).fetchall())
        return [
            CallUsageSum(
                run_id=row[0],
                model=row[1],
                sums={key: int(value) for key, value in zip(keys, row[2:], strict=True)},
            )
            for row in rows
        ]

    async def last_call_id(self) -> int:
        row = await self._sql.lookup(  # the end of the rowid b-tree
            lambda conn: conn.execute("SELECT COALESCE(MAX(id), 0) FROM calls").fetchone()
        )
        return int(row[0])

    async def session_calls(self, session_id: str) -> list[CallRecord]:
        rows = await self._sql.read(
            lambda conn: fetch_rows(
                conn,
                CALL_SQL
                + " WHERE c.run_id IN (SELECT id FROM runs WHERE session_id = ?) ORDER BY c.id",
                (session_id,),
            )
        )
        return [call_record(row) for row in rows]

    # ----------------------------------------------------------------- tools
    async def tool_events(self, run_id: str, call_ids: Sequence[str]) -> list[ToolEventRecord]:
        if not call_ids:
            return []
        marks = ", ".join("?" for _ in call_ids)
        rows = await self._sql.lookup(
            lambda conn: fetch_rows(
                conn,
                f"SELECT * FROM tool_events WHERE run_id = ? AND call_id IN ({marks}) ORDER BY id",
                (run_id, *call_ids),
            )
        )
        return [tool_event_record(row) for row in rows]

    async def session_tool_events(
        self, session_id: str, events: Sequence[str]
    ) -> list[ToolEventRecord]:
        if not events:
            return []
        marks = ", ".join("?" for _ in events)
        rows = await self._sql.read(
            lambda conn: fetch_rows(
                conn,
                f"SELECT * FROM tool_events WHERE event IN ({marks}) AND run_id IN "
                "(SELECT id FROM runs WHERE session_id = ?) ORDER BY id",
                (*events, session_id),
            )
        )
        return [tool_event_record(row) for row in rows]

    # ----------------------------------------------------------------- snapshots
    async def latest_snapshot(self, run_id: str) -> SnapshotRecord | None:
        rows = await self._sql.lookup(
            lambda conn: fetch_rows(
                conn,
                "SELECT * FROM snapshots WHERE run_id = ? ORDER BY version DESC LIMIT 1",
                (run_id,),
            )
        )
        return SnapshotRecord(**rows[0]) if rows else None

    async def get_snapshot(self, run_id: str, version: int) -> SnapshotRecord | None:
        rows = await self._sql.read(
            lambda conn: fetch_rows(
                conn,
                "SELECT * FROM snapshots WHERE run_id = ? AND version = ?",
                (run_id, version),
            )
        )
        return SnapshotRecord(**rows[0]) if rows else None

    async def list_snapshots(self, run_id: str) -> list[SnapshotRecord]:
        """Every snapshot of a run, oldest first."""
        rows = await self._sql.read(
            lambda conn: fetch_rows(
                conn, "SELECT * FROM snapshots WHERE run_id = ? ORDER BY version", (run_id,)
            )
        )
        return [SnapshotRecord(**row) for row in rows]

    # ----------------------------------------------------------------- boundaries
    async def list_boundaries(
        self, *, run_id: str | None = None, session_id: str | None = None
    ) -> list[BoundaryRecord]:
        """A run's (or session's) boundaries. Whether there is any is looked up on the
        loop's thread first (an index read): most sessions have none, and then their
        result costs no hop to the worker thread."""
        if run_id is not None:
            where, params = "WHERE run_id = ?", (run_id,)
        else:
            where = "WHERE run_id IN (SELECT id FROM runs WHERE session_id = ?)"
            params = (session_id or "",)
        some = await self._sql.lookup(
            lambda conn: conn.execute(
                f"SELECT 1 FROM boundaries {where} LIMIT 1", params
            ).fetchone()
        )
        if some is None:
            return []
        sql = f"SELECT * FROM boundaries {where} ORDER BY id"
        rows = await self._sql.read(lambda conn: fetch_rows(conn, sql, params))
        return [BoundaryRecord(**row) for row in rows]

    async def get_boundary(self, boundary_id: int) -> BoundaryRecord | None:
        rows = await self._sql.read(
            lambda conn: fetch_rows(conn, "SELECT * FROM boundaries WHERE id = ?", (boundary_id,))
        )
        return BoundaryRecord(**rows[0]) if rows else None

    async def count_boundaries(self, run_id: str, status: str = "ok") -> int:
        row = await self._sql.lookup(
            lambda conn: conn.execute(
                "SELECT COUNT(*) FROM boundaries WHERE run_id = ? AND status = ?",
                (run_id, status),
            ).fetchone()
        )
        return int(row[0])

    async def latest_boundary(self, run_id: str) -> BoundaryRecord | None:
        rows = await self._sql.lookup(
            lambda conn: fetch_rows(
                conn,
                "SELECT * FROM boundaries WHERE run_id = ? AND status = 'ok' "
                "ORDER BY id DESC LIMIT 1",
                (run_id,),
            )
        )
        return BoundaryRecord(**rows[0]) if rows else None

    # ----------------------------------------------------------------- spills
    async def get_spill(self, handle: str) -> str | None:
        spill = await self.get_spill_record(handle)
        return spill.content if spill else None

    async def get_spill_record(self, handle: str) -> SpillRecord | None:
        """The spill behind ``handle`` with the run that saved it.

        Raises:
            StoreError: the spill refers to a tool event that is not stored.
        """
        rows = await self._sql.read(lambda conn: fetch_rows(conn, _SPILL_SQL, (handle,)))
        return spill_record(handle, rows[0]) if rows else None

    # ----------------------------------------------------------------- history search
    async def search_history(self, run_id: str, text: str, limit: int = 5) -> list[HistoryHit]:
        """Full-text matches of ``text``'s words in one run's original messages and spills.

        Every word must match; if nothing does, any word may. Best matches first.
        """
        # the index's own words (unicode61: letters and digits), so none is a phrase
        words = re.findall(r"[^\W_]+", text)
        if not words:
            return []
        quoted = ['"' + w.replace('"', '""') + '"' for w in words]
        sql = (
            " UNION ALL ".join(
                f"SELECT source, ref, snippet({table}, 0, '[', ']', '…', 16) AS snippet, "
                f"rank FROM {table} WHERE {table} MATCH ? AND run_id = ?"
                for table in ("history_fts", "history_spill_fts")
            )
            + " ORDER BY rank LIMIT ?"
        )

        def search(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            match = " ".join(quoted)
            rows = fetch_rows(conn, sql, (match, run_id, match, run_id, limit))
            if not rows and len(quoted) > 1:
                match = " OR ".join(quoted)
                rows = fetch_rows(conn, sql, (match, run_id, match, run_id, limit))
            return rows

        return history_hits(await self._sql.read(search))
