"""``open_store``: the backend a database string names (a file, or ``postgresql://``)."""

from __future__ import annotations

import os

from anabranch.errors import DatabaseError
from anabranch.store._dsn import is_postgres_url, redact_dsn
from anabranch.store._protocol import Store
from anabranch.store.sqlite import SQLiteStore, Synchronous

__all__ = ["describe_db", "is_postgres_url", "open_store"]


def describe_db(db: str | os.PathLike[str]) -> str:
    """``db`` as it may be shown to a user: a DSN loses its password."""
    text = os.fspath(db)
    return redact_dsn(text) if is_postgres_url(text) else text


async def open_store(
    db: str | os.PathLike[str],
    *,
    create: bool = True,
    synchronous: Synchronous = "FULL",
    lease_ttl: float | None = None,
) -> Store:
    """Open the store ``db`` names: ``postgresql://…`` is PostgreSQL (``synchronous`` does
    not apply: PostgreSQL's own ``synchronous_commit`` does), anything else a SQLite file.
    ``lease_ttl``: the ttl of the leases this process takes (PostgreSQL ends a transaction
    of a process frozen that long, so its row locks cannot outlast its leases).

    Raises:
        DatabaseError: the database cannot be used, or the PostgreSQL extra is missing.
    """
    text = os.fspath(db)
    if is_postgres_url(text):
        try:
            from anabranch.store.postgres import PostgresStore
        except ImportError as exc:
            raise DatabaseError(
                f"{redact_dsn(text)} is a PostgreSQL database: install the PostgreSQL "
                f"extra (pip install 'anabranch[postgres]'): {exc}"
            ) from None
        if lease_ttl is None:
            return await PostgresStore.open(text, create=create)
        return await PostgresStore.open(text, create=create, stall_timeout=lease_ttl)
    return await SQLiteStore.open(text, create=create, synchronous=synchronous)
