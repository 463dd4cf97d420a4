"""The PostgreSQL backend of the conformance suite: a fresh database on the test cluster.

Commits are counted by the server: ``pg_stat_statements`` counts every ``COMMIT`` the
database executed (the test cluster preloads it)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import psycopg

from anabranch.store import PostgresStore, Store
from anabranch.store.postgres._schema import APP_ID, MIGRATIONS, SCHEMA, SCHEMA_VERSION
from tests.postgres_cluster import Cluster, create_database
from tests.store_conformance.conftest import Backend

__all__ = ["postgres_backend"]

_cluster: list[Cluster] = []
"""The session's test cluster (set by the ``backend`` fixture)."""


@asynccontextmanager
async def postgres_backend(tmp_path: Path) -> AsyncIterator[Backend]:
    assert _cluster, "the postgres_cluster fixture did not run"
    dsn = create_database(_cluster[0])
    admin = psycopg.connect(dsn, autocommit=True)
    admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    def commits() -> int:
        row = admin.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = current_database() AND upper(s.query) = 'COMMIT'"
        ).fetchone()
        return int(row[0]) if row else 0

    async def open_store() -> Store:
        store = await PostgresStore.open(dsn)
        backend.opened.append(store)
        return store

    async def make_old(version: int) -> None:
        with psycopg.connect(dsn) as conn:  # one transaction, committed on exit
            conn.execute(f"CREATE SCHEMA {SCHEMA}")
            conn.execute(f"SET search_path TO {SCHEMA}")
            for script in MIGRATIONS[:version]:
                conn.execute(script)
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('app', %s), ('schema_version', %s)",
                (APP_ID, str(version)),
            )
            conn.execute(
                "INSERT INTO sessions (id, created, kind, entry, task) "
                "VALUES ('ses_old', %s, 'agent', 'a', 't')",
                (time.time(),),
            )
            conn.execute(
                "INSERT INTO session_events (session_id, status, output, created) "
                "VALUES ('ses_old', 'done', 'kept', 1.0)"
            )

    async def stamp_version(version: int) -> None:
        admin.execute(
            "UPDATE anabranch.meta SET value = %s WHERE key = 'schema_version'", (str(version),)
        )

    async def fingerprint() -> bytes:
        digest = hashlib.sha256()
        tables = admin.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'anabranch' ORDER BY tablename"
        ).fetchall()
        for (table,) in tables:
            rows = admin.execute(f"SELECT * FROM anabranch.{table} ORDER BY 1").fetchall()
            digest.update(f"{table}:{rows!r}".encode())
        return digest.digest()

    backend = Backend(
        open_store, commits, make_old, stamp_version, fingerprint, schema_version=SCHEMA_VERSION
    )
    try:
        yield backend
    finally:
        for store in backend.opened:
            await store.close()
        admin.close()
