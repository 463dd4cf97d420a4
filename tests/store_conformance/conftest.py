"""The backends the conformance suite runs on (see the package docstring to add one)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sqlite_utils

from anabranch.store import RunRecord, SessionRecord, SQLiteStore, Store
from anabranch.store.sqlite._schema import APP_ID, MIGRATIONS, SCHEMA_VERSION


@dataclass
class Backend:
    """One store implementation, as the conformance tests see it."""

    open: Callable[[], Awaitable[Store]]
    """Open (creating or migrating) the test's database: a new connection each call."""
    commits: Callable[[], int]
    """How many write transactions the database has committed through stores this backend
    opened: counted where the database sees them, not by the store's own bookkeeping."""
    make_old: Callable[[int], Awaitable[None]]
    """Create the (not yet opened) database at an older schema version, with one session."""
    stamp_version: Callable[[int], Awaitable[None]]
    """Mark the database as being at schema ``version`` (to fake a newer one)."""
    fingerprint: Callable[[], Awaitable[bytes]]
    """A digest of the database's stored contents (unchanged means nothing was written)."""
    schema_version: int = SCHEMA_VERSION
    opened: list[Store] = field(default_factory=list)


@asynccontextmanager
async def sqlite_backend(tmp_path: Path) -> AsyncIterator[Backend]:
    path = tmp_path / "conformance.sqlite"
    commits = [0]

    def count(statement: str) -> None:
        if statement.strip().upper().startswith("COMMIT"):
            commits[0] += 1

    async def open_store() -> Store:
        store = await SQLiteStore.open(path)
        # every statement of this store goes through this one connection
        store._sql._conn.set_trace_callback(count)
        made.opened.append(store)
        return store

    async def make_old(version: int) -> None:
        db = sqlite_utils.Database(path)
        for migration in MIGRATIONS[:version]:
            migration(db)
        db.execute(
            "INSERT OR REPLACE INTO meta(key, value) VALUES ('app', ?), ('schema_version', ?)",
            (APP_ID, str(version)),
        )
        db.table("sessions").insert(
            {"id": "ses_old", "created": time.time(), "kind": "agent", "entry": "a", "task": "t"}
        )
        db.table("session_events").insert(
            {"session_id": "ses_old", "status": "done", "output": "kept", "created": 1.0}
        )
        db.conn.commit()
        db.close()

    async def stamp_version(version: int) -> None:
        conn = sqlite3.connect(path)
        with conn:
            conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),))
        conn.close()

    async def fingerprint() -> bytes:
        wal = Path(f"{path}-wal")
        return path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")

    made = Backend(open_store, lambda: commits[0], make_old, stamp_version, fingerprint)
    try:
        yield made
    finally:
        for store in made.opened:
            await store.close()


BackendFactory = Callable[[Path], AbstractAsyncContextManager[Backend]]


def _postgres(tmp_path: Path) -> AbstractAsyncContextManager[Backend]:
    from tests.store_conformance._postgres import postgres_backend

    return postgres_backend(tmp_path)


BACKENDS = [
    pytest.param(sqlite_backend, id="sqlite"),
    pytest.param(_postgres, id="postgres"),
]


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    factory: BackendFactory = request.param
    if factory is _postgres:  # a fresh database on the session's cluster
        from tests.store_conformance import _postgres as postgres

        postgres._cluster[:] = [request.getfixturevalue("postgres_cluster")]
    async with factory(tmp_path) as opened:
        yield opened


@pytest.fixture
async def store(backend: Backend) -> Store:
    """An open store on a fresh database of the backend (closed by the backend)."""
    return await backend.open()


async def add_session(store: Store, session_id: str = "ses_1") -> None:
    await store.create_session(
        SessionRecord(id=session_id, created=time.time(), kind="agent", entry="a", task="t")
    )


async def add_run(store: Store, run_id: str = "run_1", session_id: str = "ses_1") -> None:
    await store.create_run(
        RunRecord(id=run_id, session_id=session_id, agent_name="a", model="m", created=1.0)
    )
