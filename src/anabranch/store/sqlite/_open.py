"""Opening an SQLite file as an anabranch database: validate, configure, migrate.

Opening never writes to a file that is not an anabranch database (or has a newer schema,
or is corrupt): those raise ``DatabaseError`` before anything is written. A new file is
created owner-only (0600); an existing one readable by others is made owner-only (with its
``-wal`` and ``-shm``), or refused when that is not possible. The connection runs in WAL
mode with ``synchronous=FULL`` unless told otherwise.

- **Several processes may create one new file at once.** The schema is created (or
  migrated) inside ``BEGIN IMMEDIATE`` from the version read *under that lock*, so the
  second process finds the first one's schema instead of creating it again.
- **A lock held too long is one clear error.** A writer waits up to ``lock_timeout``
  seconds for another process's write lock, then raises ``StoreError`` saying so.
- **Read-only opens write nothing.** ``read_only=True`` connects with ``mode=ro``: no
  mode change, no WAL switch, no migration. An older schema is migrated in a private
  in-memory copy, so the file stays readable by the anabranch that wrote it.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path
from typing import Literal

from anabranch.errors import DatabaseError
from anabranch.store.sqlite._rows import StoreConnection
from anabranch.store.sqlite._schema import APP_ID, SCHEMA_VERSION, migrate

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "Synchronous",
    "lock_timeout_from_env",
    "open_connection",
    "open_read_only",
    "schema_version",
]

Synchronous = Literal["OFF", "NORMAL", "FULL", "EXTRA"]

DEFAULT_LOCK_TIMEOUT = 30.0
PAGE_SIZE = 8192
"""Page size of a new file. Twice SQLite's default: rows of 2-4 kB (tool outputs, tool
events) leave less of a page unused (at 4 kB a 2.1 kB row takes a page of its own)."""
"""Seconds a writer waits for another process's write lock (``$ANABRANCH_LOCK_TIMEOUT``)."""


def lock_timeout_from_env() -> float:
    """``$ANABRANCH_LOCK_TIMEOUT`` (seconds) or the default; a bad value is a one-line error."""
    text = os.environ.get("ANABRANCH_LOCK_TIMEOUT", "")
    if not text:
        return DEFAULT_LOCK_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise DatabaseError(f"ANABRANCH_LOCK_TIMEOUT must be a number of seconds, got {text!r}")
    return value


def _owner_only(path: Path) -> None:
    """Make ``path`` (and its ``-wal``/``-shm``) owner-only, or refuse to use it."""
    for file in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        try:
            mode = stat.S_IMODE(file.stat().st_mode)
        except FileNotFoundError:
            continue
        if not mode & 0o077:
            continue
        try:
            os.chmod(file, mode & 0o700)
        except OSError as exc:
            raise DatabaseError(
                f"{file} is readable by others (mode {mode:o}) and cannot be made owner-only "
                f"({exc.strerror}); run: chmod go-rwx {file}"
            ) from None


def _create_owner_only(path: Path) -> None:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    os.close(fd)


def open_connection(
    path: Path,
    create: bool,
    synchronous: Synchronous,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> sqlite3.Connection:
    """A configured connection to the (created or migrated) database at ``path``.

    Raises:
        DatabaseError: no file (and ``create`` is false), not an anabranch database,
            a newer schema, a corrupt file, or one that cannot be made owner-only.
            Nothing is written in those cases.
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
    elif not path.is_file():
        raise DatabaseError(f"{path} is not a regular file")
    elif Path(f"{path}-wal").exists():
        # Check through a read-only connection first: closing a read-write one would
        # checkpoint the WAL into a file we may be about to refuse (a newer schema).
        _check_read_only(path)
    try:
        conn = sqlite3.connect(
            path,
            check_same_thread=False,
            isolation_level=None,
            timeout=lock_timeout,
            factory=StoreConnection,
        )
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot open {path}: {exc}") from exc
    try:
        version = schema_version(conn, path)
        _owner_only(path)
        if version == 0:  # a new file: its page size is set before anything is written
            conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute(f"PRAGMA busy_timeout={int(lock_timeout * 1000)}")
        if version < SCHEMA_VERSION:
            _migrate(conn, path)
    except sqlite3.Error as exc:
        conn.close()
        reason = describe_sqlite_error(exc, lock_timeout)
        raise DatabaseError(f"cannot open {path}: {reason}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


def describe_sqlite_error(exc: sqlite3.Error, lock_timeout: float) -> str:
    """The driver's error in words a user can act on (a lock held too long, say)."""
    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return (
            f"the database is locked: another process has held its write lock for over "
            f"{lock_timeout:g} s (is one stopped or stuck?); let it finish or stop it, then retry"
        )
    return f"{type(exc).__name__}: {exc}"


def open_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection that never writes ``path`` (nor its mode, WAL or schema).

    An older schema is migrated in an in-memory copy, so it can be read with the current
    queries while the file stays as its anabranch left it.

    Raises:
        DatabaseError: no file, not an anabranch database, a newer schema, or corrupt.
    """
    path = path.expanduser()
    if not path.exists():
        raise DatabaseError(f"no anabranch database at {path}")
    if path.is_dir():
        raise DatabaseError(f"{path} is a folder, not a database file")
    if not path.is_file():
        raise DatabaseError(f"{path} is not a regular file")
    uri = path.absolute().as_uri()
    # Validate first without creating anything: with no -wal file no writer is connected,
    # and an immutable read creates no -wal/-shm next to a file we may refuse.
    quiet = not Path(f"{path}-wal").exists()
    try:
        conn = sqlite3.connect(
            f"{uri}?mode=ro{'&immutable=1' if quiet else ''}", uri=True, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot open {path} read-only: {exc}") from exc
    try:
        version = schema_version(conn, path)
    except BaseException:
        conn.close()
        raise
    if version == SCHEMA_VERSION:
        if quiet:  # read it as a live database now (a writer may start meanwhile)
            live = sqlite3.connect(f"{uri}?mode=ro", uri=True, check_same_thread=False)
            try:
                live.execute("SELECT 1 FROM meta LIMIT 1").fetchall()
            except sqlite3.Error:  # WAL in a folder we cannot write: read the file as it is
                live.close()
            else:
                conn.close()
                conn = live
        conn.isolation_level = None
        return conn
    copy = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    try:
        conn.backup(copy)
    finally:
        conn.close()
    _migrate(copy, path)
    return copy


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Apply the migrations after the file's version in one transaction (all or none).

    The version is read again under the write lock: another process may have created or
    migrated the schema since this one looked (two ``anabranch run`` on one new file).
    """
    import sqlite_utils  # only when there is something to migrate (a slow import)

    conn.execute("BEGIN IMMEDIATE")
    try:
        version = schema_version(conn, path)
        if version >= SCHEMA_VERSION:
            conn.execute("COMMIT")
            return
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
    recorded = meta.get("schema_version", "0")
    try:
        version = int(recorded)
    except (TypeError, ValueError):
        raise DatabaseError(
            f"{path} has a malformed schema version ({recorded!r}); it was not written by "
            "anabranch, or was damaged"
        ) from None
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
