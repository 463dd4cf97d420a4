"""Opening an SQLite file as an anabranch database: validate, configure, migrate.

Opening never writes to a file that is not an anabranch database (or has a newer schema,
or is corrupt): those raise ``DatabaseError`` before anything is written. A new file is
created owner-only (0600); the connection runs in WAL mode with ``synchronous=FULL``
unless told otherwise.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Literal

import sqlite_utils

from anabranch.errors import DatabaseError
from anabranch.store.sqlite._schema import APP_ID, SCHEMA_VERSION, migrate

__all__ = ["Synchronous", "open_connection", "schema_version"]

Synchronous = Literal["OFF", "NORMAL", "FULL", "EXTRA"]


def _create_owner_only(path: Path) -> None:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    os.close(fd)


def open_connection(path: Path, create: bool, synchronous: Synchronous) -> sqlite3.Connection:
    """A configured connection to the (created or migrated) database at ``path``.

    Raises:
        DatabaseError: no file (and ``create`` is false), not an anabranch database,
            a newer schema, or a corrupt file. Nothing is written in those cases.
    """
    path = path.expanduser()
    if not path.exists():
        if not create:
            raise DatabaseError(f"no anabranch database at {path}")
        if not path.parent.exists():
            raise DatabaseError(f"cannot create {path}: folder {path.parent} does not exist")
        _create_owner_only(path)
    elif path.is_dir():
        raise DatabaseError(f"{path} is a folder, not a database file")
    elif Path(f"{path}-wal").exists():
        # Check through a read-only connection first: closing a read-write one would
        # checkpoint the WAL into a file we may be about to refuse (a newer schema).
        _check_read_only(path)
    try:
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30.0)
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot open {path}: {exc}") from exc
    try:
        version = schema_version(conn, path)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=30000")
        if version < SCHEMA_VERSION:
            _migrate(conn, version)
    except sqlite3.Error as exc:
        conn.close()
        raise DatabaseError(f"cannot open {path}: {type(exc).__name__}: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


def _migrate(conn: sqlite3.Connection, version: int) -> None:
    """Apply the migrations after ``version`` in one transaction (all or none)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        migrate(sqlite_utils.Database(conn), version)
        conn.execute(
            "INSERT OR REPLACE INTO meta(key, value) VALUES ('app', ?), ('schema_version', ?)",
            (APP_ID, str(SCHEMA_VERSION)),
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _check_read_only(path: Path) -> None:
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot open {path}: {exc}") from exc
    try:
        schema_version(conn, path)
    finally:
        conn.close()


def schema_version(conn: sqlite3.Connection, path: Path) -> int:
    """The schema version of an existing file (0 if empty). Reads only.

    Raises:
        DatabaseError: not an anabranch database, a newer schema, or corrupt.
    """
    try:
        tables = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        meta = (
            dict(conn.execute("SELECT key, value FROM meta").fetchall()) if "meta" in tables else {}
        )
    except sqlite3.DatabaseError as exc:
        if "malformed" in str(exc):
            raise DatabaseError(f"{path} is corrupt: {exc}") from exc
        raise DatabaseError(f"{path} is not a readable SQLite database: {exc}") from exc
    if not tables:
        return 0
    if meta.get("app") != APP_ID:
        raise DatabaseError(f"{path} is not an anabranch database")
    version = int(meta.get("schema_version", "0"))
    if version > SCHEMA_VERSION:
        raise DatabaseError(
            f"{path} has schema version {version}, newer than this anabranch "
            f"understands ({SCHEMA_VERSION}); upgrade anabranch"
        )
    try:
        check = conn.execute("PRAGMA quick_check").fetchone()
    except sqlite3.DatabaseError as exc:
        raise DatabaseError(f"{path} is corrupt: {exc}") from exc
    if check is None or check[0] != "ok":
        raise DatabaseError(f"{path} is corrupt: {check[0] if check else 'no answer'}")
    return version
