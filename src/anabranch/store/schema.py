"""Versioned schema and forward-only migrations.

Every table is insert-only except ``leases`` (who drives a session now) and ``meta``:
a session's or run's status is the latest row of ``session_events`` / ``run_ends``.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlite_utils

__all__ = ["APP_ID", "SCHEMA_VERSION", "migrate"]

APP_ID = "anabranch"


def _v1(db: sqlite_utils.Database) -> None:
    db.table("meta").create({"key": str, "value": str}, pk="key")
    db.table("sessions").create(
        {
            "id": str,
            "created": float,
            "kind": str,
            "entry": str,
            "task": str,
            "source": str,
            "definition": str,
        },
        pk="id",
    )
    db.table("session_events").create(
        {
            "id": int,
            "session_id": str,
            "status": str,
            "output": str,
            "error": str,
            "created": float,
        },
        pk="id",
    )
    db.table("session_events").create_index(["session_id"])
    db.table("leases").create(
        {"session_id": str, "owner": str, "host": str, "pid": int, "expires": float},
        pk="session_id",
    )
    db.table("runs").create(
        {
            "id": str,
            "session_id": str,
            "parent_run_id": str,
            "parent_call_id": str,
            "task_id": str,
            "agent_name": str,
            "model": str,
            "depth": int,
            "mode": str,
            "created": float,
        },
        pk="id",
    )
    db.table("run_ends").create(
        {"run_id": str, "status": str, "output": str, "error": str, "finished": float},
        pk="run_id",
    )
    db.table("runs").create_index(["session_id"])
    db.table("runs").create_index(["parent_run_id", "parent_call_id"])
    db.table("messages").create(
        {
            "id": int,
            "run_id": str,
            "seq": int,
            "role": str,
            "content": str,
            "kind": str,
            "created": float,
        },
        pk="id",
    )
    db.table("messages").create_index(["run_id", "seq"], unique=True)
    db.table("calls").create(
        {
            "id": int,
            "run_id": str,
            "turn": int,
            "attempt": int,
            "fingerprint": str,
            "message_count": int,
            "created": float,
        },
        pk="id",
    )
    db.table("calls").create_index(["run_id", "turn"])
    db.table("call_outcomes").create(
        {
            "id": int,
            "call_id": int,
            "status": str,
            "error_type": str,
            "error": str,
            "response_id": str,
            "model": str,
            "stop_reason": str,
            "usage": str,
            "message_seq": int,
            "created": float,
        },
        pk="id",
    )
    db.table("call_outcomes").create_index(["call_id"], unique=True)
    db.table("tool_events").create(
        {
            "id": int,
            "run_id": str,
            "call_id": str,
            "name": str,
            "event": str,
            "content": str,
            "is_error": int,
            "created": float,
        },
        pk="id",
    )
    db.table("tool_events").create_index(["run_id", "call_id"])
    db.table("snapshots").create(
        {
            "id": int,
            "run_id": str,
            "version": int,
            "reason": str,
            "system": str,
            "tools": str,
            "created": float,
        },
        pk="id",
    )
    db.table("snapshots").create_index(["run_id", "version"], unique=True)
    db.table("boundaries").create(
        {
            "id": int,
            "run_id": str,
            "kind": str,
            "prefix": str,
            "ranges": str,
            "strategy": str,
            "trigger": str,
            "tokens_before": int,
            "tokens_after": int,
            "messages_before": int,
            "messages_after": int,
            "summary": str,
            "model": str,
            "duration": float,
            "status": str,
            "error": str,
            "extra": str,
            "created": float,
        },
        pk="id",
    )
    db.table("boundaries").create_index(["run_id"])
    db.table("spills").create(
        {"handle": str, "run_id": str, "call_id": str, "content": str, "created": float},
        pk="handle",
    )
    db.table("spills").create_index(["run_id"])
    db.table("cache_breaks").create(
        {
            "id": int,
            "run_id": str,
            "call_id": int,
            "cause": str,
            "expected_read": int,
            "actual_read": int,
            "created": float,
        },
        pk="id",
    )
    db.table("cache_breaks").create_index(["run_id"])


def _v2_call_prefix(db: sqlite_utils.Database) -> None:
    """Which prompt snapshot and how many compactions each call was sent with."""
    db.table("calls").add_column("snapshot_version", int)
    db.table("calls").add_column("compactions", int)


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_v1, _v2_call_prefix]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(db: sqlite_utils.Database, current: int) -> None:
    """Apply every migration after ``current`` (0 for a new database)."""
    for version in range(current, SCHEMA_VERSION):
        MIGRATIONS[version](db)
