"""``GroupCommitConnection``: one SQLite connection shared by many tasks, writes group-committed.

Invariants (the store's correctness rests on them; the conformance suite checks each):

- **One connection, one statement at a time.** Every read and write holds ``limiter``
  (a ``CapacityLimiter(1)``) for the length of its statements, and thread hops go through a
  second one-slot limiter: a single writer, never ``database is locked`` between our tasks.
- **A write returns only once it is committed.** ``write(fn)`` queues ``fn`` and waits
  until the transaction holding it has committed (or rolled back: then it raises).
- **Every write is atomic and isolated.** When a batch holds several writes, each runs in
  its own savepoint: one write's error rolls back that write alone, and its caller alone
  gets the error. A lone write runs directly in its own transaction.
- **Group commit.** Writes that arrive while a transaction is being committed wait and are
  committed together in the next transaction (one ``BEGIN IMMEDIATE ... COMMIT``, one
  fsync, for the whole batch). The first waiting writer leads the next commit; nobody
  polls.
- **Cancellation never splits a write.** Queued and committing writes are shielded from
  cancellation: a cancelled caller leaves either its whole write or none of it, and a
  batch is never abandoned half-way.
- **No raw driver error escapes.** ``sqlite3.Error`` becomes ``StoreError`` (the original
  as ``__cause__``); errors a write raises on purpose (``SessionBusyError``) pass through.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from anabranch.errors import StoreError
from anabranch.store.sqlite._open import DEFAULT_LOCK_TIMEOUT, describe_sqlite_error

__all__ = ["GroupCommitConnection"]

T = TypeVar("T")


@dataclass(eq=False)
class _Write:
    """One queued write: its function, and once committed, its result or error."""

    fn: Callable[[sqlite3.Connection], Any]
    done: bool = False
    result: Any = None
    error: BaseException | None = None
    wake: anyio.Event | None = None
    """Made when the write has to wait; set when it is committed or should lead next."""


def _store_error(exc: sqlite3.Error, lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> StoreError:
    error = StoreError(f"the store failed: {describe_sqlite_error(exc, lock_timeout)}")
    error.__cause__ = exc
    return error


def _commit_batch(conn: sqlite3.Connection, batch: list[_Write]) -> None:
    """Run ``batch`` in one transaction; each write in a savepoint when there are several."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        if len(batch) == 1:
            batch[0].result = batch[0].fn(conn)
        else:
            for write in batch:
                conn.execute("SAVEPOINT anabranch_write")
                try:
                    write.result = write.fn(conn)
                except Exception as exc:
                    conn.execute("ROLLBACK TO anabranch_write")
                    write.error = exc
                conn.execute("RELEASE anabranch_write")
        conn.execute("COMMIT")
    except BaseException as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        for write in batch:
            write.error = write.error or exc
            write.result = None
    finally:
        for write in batch:
            write.done = True


class GroupCommitConnection:
    """Reads and group-committed writes over one open SQLite connection."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        limiter: anyio.CapacityLimiter,
        *,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    ) -> None:
        self._conn = conn
        self._lock_timeout = lock_timeout
        self._limiter = limiter
        """Held by whoever uses the connection (a task, for the length of its statement)."""
        self._thread = anyio.CapacityLimiter(1)
        self._queue: list[_Write] = []
        self._committing = False
        self._closed = False

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            async with self._limiter:
                await anyio.to_thread.run_sync(self._conn.close, limiter=self._thread)

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run a read on the worker thread."""
        async with self._limiter:
            try:
                return await anyio.to_thread.run_sync(fn, self._conn, limiter=self._thread)
            except sqlite3.Error as exc:
                raise _store_error(exc, self._lock_timeout) from exc

    async def lookup(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A point read through an index (a few rows, well under a millisecond): run on the
        event loop's thread, where a hop to the worker thread would cost more than it."""
        async with self._limiter:
            try:
                return fn(self._conn)
            except sqlite3.Error as exc:
                raise _store_error(exc, self._lock_timeout) from exc

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Commit ``fn``'s statements atomically (possibly together with other writes).

        The first writer to find no commit in progress leads: it commits every queued
        write in one transaction, then wakes them and the first writer queued meanwhile,
        which leads the next commit.
        """
        write = _Write(fn)
        self._queue.append(write)
        with anyio.CancelScope(shield=True):
            while not write.done:
                if self._committing:
                    write.wake = anyio.Event()
                    await write.wake.wait()
                    continue
                await self._commit_queue()
        if write.error is not None:
            if isinstance(write.error, sqlite3.Error):
                raise _store_error(write.error, self._lock_timeout) from write.error
            raise write.error
        result: T = write.result
        return result

    async def _commit_queue(self) -> None:
        self._committing = True
        batch, self._queue = self._queue, []
        try:
            async with self._limiter:
                await anyio.to_thread.run_sync(
                    _commit_batch, self._conn, batch, limiter=self._thread
                )
        except BaseException as exc:  # the batch never ran: fail its writes, not hang them
            for write in batch:
                if not write.done:
                    write.error, write.done = exc, True
            raise
        finally:
            self._committing = False
            # wake the next leader first: its commit then overlaps with this batch's
            # writers going on with their work
            if self._queue and self._queue[0].wake is not None:
                self._queue[0].wake.set()
            for write in batch:
                if write.wake is not None:
                    write.wake.set()
