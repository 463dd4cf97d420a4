"""Schema v2: calls remember their snapshot version and compaction count."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlite_utils

from anabranch.store import CallRecord, SQLiteStore
from anabranch.store.sqlite._schema import MIGRATIONS, SCHEMA_VERSION

pytestmark = pytest.mark.anyio


async def test_a_v1_database_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    db = sqlite_utils.Database(conn)
    MIGRATIONS[0](db)
    conn.execute(
        "INSERT INTO meta(key, value) VALUES ('app', 'anabranch'), ('schema_version', '1')"
    )
    conn.execute(
        "INSERT INTO calls(run_id, turn, attempt, fingerprint, message_count, created) "
        "VALUES ('run_old', 1, 1, 'f', 1, 1.0)"
    )
    conn.close()
    async with await SQLiteStore.open(path) as store:
        version = await store.query("SELECT value FROM meta WHERE key = 'schema_version'")
        assert version == [{"value": str(SCHEMA_VERSION)}]
        [old] = await store.list_calls("run_old")
        assert old.snapshot_version is None and old.compactions is None
        new_id = await store.begin_call(
            CallRecord(
                run_id="run_old",
                turn=2,
                attempt=1,
                fingerprint="g",
                message_count=2,
                created=2.0,
                snapshot_version=3,
                compactions=1,
            ),
            (),
        )
        await store.finish_call(new_id, status="ok", usage="{}")
        [latest] = await store.recent_ok_calls("run_old", up_to=new_id)
        assert (latest.snapshot_version, latest.compactions) == (3, 1)
