"""Connections of one ``PostgresStore``: a writer with group commit, and a reader.

psycopg 3's synchronous connections run in worker threads (``anyio.to_thread``), one
statement batch at a time per connection. That runs the same under asyncio and trio:
psycopg's async connections are asyncio-only.

Group commit, as in the SQLite store: writes that arrive while a transaction is being
committed go together into the next one, each in its own savepoint (one write's error
rolls back only that write). A transaction that loses a deadlock or a serialization race
is rolled back whole and run again: no write of it was committed.

No raw driver error escapes: ``psycopg.Error`` becomes ``StoreError`` (the original as
``__cause__``, its text without any DSN password); errors a write raises on purpose
(``LeaseLostError``, ``SessionBusyError``) pass through.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import psycopg
import psycopg.errors
from psycopg.rows import dict_row

from anabranch.errors import DatabaseError, StoreError
from anabranch.store._dsn import redact_dsn
from anabranch.store.postgres._schema import SCHEMA

__all__ = ["NOW", "Batch", "Connections", "Write", "connect", "store_error"]

NOW = "extract(epoch from clock_timestamp())"
"""The database clock, in seconds, as SQL: leases and heartbeats use it, not the host's."""

T = TypeVar("T")
Conn = psycopg.Connection[dict[str, Any]]
RETRIES = 5
"""How often a batch that lost a deadlock or serialization race is run again."""


class Batch:
    """What the writes of one transaction share (e.g. lease checks made once per batch)."""

    def __init__(self) -> None:
        self.memo: dict[Any, Any] = {}


@dataclass(eq=False)
class Write:
    """One queued write: its function and, once committed, its result or error."""

    fn: Callable[[Conn, Batch], Any]
    done: bool = False
    result: Any = None
    error: BaseException | None = None
    wake: anyio.Event | None = field(default=None)


def store_error(exc: BaseException) -> BaseException:
    """``exc`` as the store raises it: a driver error becomes a ``StoreError``."""
    if not isinstance(exc, psycopg.Error):
        return exc
    message = redact_dsn(" ".join(str(exc).split()))
    error = StoreError(f"the store failed: {type(exc).__name__}: {message}")
    error.__cause__ = exc
    return error


def connect(dsn: str, *, application_name: str = "anabranch") -> Conn:
    """A connection with the store's schema first on the search path (autocommit: every
    transaction is explicit)."""
    try:
        conn: Conn = psycopg.connect(
            dsn,
            autocommit=True,
            row_factory=dict_row,
            application_name=application_name,
            connect_timeout=30,
        )
    except psycopg.Error as exc:
        message = redact_dsn(" ".join(str(exc).split()))
        raise DatabaseError(f"cannot connect to {redact_dsn(dsn)}: {message}") from None
    conn.execute(f"SET search_path TO {SCHEMA}, public")
    return conn


def _commit_batch(conn: Conn, batch: list[Write]) -> None:
    """Run ``batch`` in one transaction; each write in a savepoint when there are several."""
    for attempt in range(RETRIES):
        shared = Batch()
        try:
            with conn.transaction():
                if len(batch) == 1:
                    batch[0].result = batch[0].fn(conn, shared)
                else:
                    for write in batch:
                        try:
                            with conn.transaction():
                                write.result = write.fn(conn, shared)
                        except (
                            psycopg.errors.DeadlockDetected,
                            psycopg.errors.SerializationFailure,
                        ):
                            raise
                        except Exception as exc:
                            write.error = exc
        except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
            for write in batch:
                write.error, write.result = None, None
            if attempt + 1 < RETRIES:
                continue
            raise
        return


class Connections:
    """The writer and reader connections, each used by one thread at a time."""

    def __init__(self, dsn: str, writer: Conn, reader: Conn) -> None:
        self._dsn = dsn
        self._writer = writer
        self._reader = reader
        self._write_thread = anyio.CapacityLimiter(1)
        self._read_thread = anyio.CapacityLimiter(1)
        self._queue: list[Write] = []
        self._committing = False
        self.closed = False

    def _usable(self, conn: Conn) -> Conn:
        """``conn``, or a new connection if the server dropped it (a restart, a failover)."""
        if not conn.closed and not conn.broken:
            return conn
        return connect(self._dsn)

    async def read(self, fn: Callable[[Conn], T]) -> T:
        def run() -> T:
            self._reader = self._usable(self._reader)
            return fn(self._reader)

        return await self._guard(run, self._read_thread)

    async def write(self, fn: Callable[[Conn, Batch], T]) -> T:
        """Commit ``fn``'s statements atomically (possibly with other writes).

        The first writer to find no commit in progress leads: it commits every queued
        write in one transaction, then wakes them and the first writer queued meanwhile,
        which leads the next commit.
        """
        write = Write(fn)
        self._queue.append(write)
        with anyio.CancelScope(shield=True):
            while not write.done:
                if self._committing:
                    write.wake = anyio.Event()
                    await write.wake.wait()
                    continue
                await self._commit_queue()
        if write.error is not None:
            raise store_error(write.error)
        result: T = write.result
        return result

    async def _commit_queue(self) -> None:
        self._committing = True
        batch, self._queue = self._queue, []

        def run() -> None:
            self._writer = self._usable(self._writer)
            _commit_batch(self._writer, batch)

        try:
            await self._guard(run, self._write_thread)
        except BaseException as exc:  # the transaction failed: fail its writes, not hang them
            for write in batch:
                write.error = write.error or exc
        finally:
            for write in batch:
                write.done = True
            self._committing = False
            if self._queue and self._queue[0].wake is not None:
                self._queue[0].wake.set()
            for write in batch:
                if write.wake is not None:
                    write.wake.set()

    async def _guard(self, fn: Callable[[], T], limiter: anyio.CapacityLimiter) -> T:
        if self.closed:
            raise DatabaseError("the store is closed")
        try:
            return await anyio.to_thread.run_sync(fn, limiter=limiter)
        except psycopg.Error as exc:
            raise store_error(exc) from exc

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._writer.close, limiter=self._write_thread)
            await anyio.to_thread.run_sync(self._reader.close, limiter=self._read_thread)
