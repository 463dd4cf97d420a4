"""``GroupCommitConnection``: one SQLite connection shared by many tasks, writes group-committed.

Invariants (the store's correctness rests on them; the conformance suite checks each):

- **One connection, one statement at a time.** Every read and write holds ``limiter``
  (a ``CapacityLimiter(1)``) for the length of its statements, and thread hops go through a
  second one-slot limiter: a single writer, never ``database is locked`` between our tasks.
- **Group commit** (``anabranch.store._group_commit.GroupCommit``: a write returns once
  committed; writes arriving during a commit go together into the next one, one
  ``BEGIN IMMEDIATE ... COMMIT`` and one fsync for the batch; cancellation never splits a
  write).
- **Every write is atomic and isolated.** A batch's writes run together in its
  transaction; if one of them raises, the transaction is rolled back and run again with
  each write in its own savepoint: one write's error rolls back that write alone, and its
  caller alone gets the error. A lone write runs directly in its own transaction.
- **Search sees what is committed.** The messages and spills a transaction wrote are
  added to the history index just before it commits (``_index``).
- **No raw driver error escapes.** ``sqlite3.Error`` becomes ``StoreError`` (the original
  as ``__cause__``); errors a write raises on purpose (``SessionBusyError``) pass through.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from anabranch.errors import StoreError
from anabranch.store._group_commit import GroupCommit, QueuedWrite
from anabranch.store.sqlite._index import index_new_rows
from anabranch.store.sqlite._open import DEFAULT_LOCK_TIMEOUT, describe_sqlite_error

__all__ = ["LOOKUP_STEPS", "GroupCommitConnection"]

LOOKUP_STEPS = 10_000
"""The SQLite VM steps a ``bounded_lookup`` may take on the event loop's thread (~0.5 ms
here; the steps are counted by SQLite's progress handler)."""

T = TypeVar("T")
SQLiteJob = Callable[[sqlite3.Connection], Any]
"""A write: its statements, run on the connection inside the batch's transaction."""


def _store_error(exc: sqlite3.Error, lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> StoreError:
    error = StoreError(f"the store failed: {describe_sqlite_error(exc, lock_timeout)}")
    error.__cause__ = exc
    return error


def _run_together(conn: sqlite3.Connection, batch: list[QueuedWrite[SQLiteJob]]) -> bool:
    """Run every write of ``batch`` with no savepoint (the common case: none fails). If
    one raises, roll the whole transaction back, forget every outcome and say so."""
    for write in batch:
        try:
            write.result = write.job(conn)
        except Exception:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for done in batch:
                done.reset()
            return False
    return True


def _run_apart(conn: sqlite3.Connection, batch: list[QueuedWrite[SQLiteJob]]) -> None:
    """Run each write of ``batch`` in its own savepoint: one failing rolls back alone."""
    for write in batch:
        conn.execute("SAVEPOINT anabranch_write")
        try:
            write.result = write.job(conn)
        except Exception as exc:
            conn.execute("ROLLBACK TO anabranch_write")
            write.error = exc
        conn.execute("RELEASE anabranch_write")


def _commit_batch(
    conn: sqlite3.Connection, batch: list[QueuedWrite[SQLiteJob]], lock_timeout: float
) -> None:
    """Run ``batch`` in one transaction, its new rows indexed for search, and commit.

    Several writes run first without savepoints; only if one of them fails is the
    transaction rolled back and run again with each write in its own savepoint (a
    savepoint per write cost more than the write itself), so each error still reaches
    its own writer alone. The jobs only compute from the connection, so running one
    again is safe.
    """
    try:
        conn.execute("BEGIN IMMEDIATE")
        if len(batch) == 1:
            batch[0].result = batch[0].job(conn)
        elif not _run_together(conn, batch):
            conn.execute("BEGIN IMMEDIATE")
            _run_apart(conn, batch)
        index_new_rows(conn)
        conn.execute("COMMIT")
    except BaseException as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        for write in batch:
            write.error = write.error or exc
            write.result = None
    for write in batch:  # here, so that a write in flight needs no frame of ours to wait
        if isinstance(write.error, sqlite3.Error):
            write.error = _store_error(write.error, lock_timeout)


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
        self._writes: GroupCommit[SQLiteJob] = GroupCommit(self._commit)
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

    async def bounded_lookup(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A read that is a few index lookups for most callers but can be a long scan for
        some (a session's usage: its calls' outcomes): run on the event loop's thread as
        ``lookup`` while it takes at most ``LOOKUP_STEPS`` SQLite VM steps, else given up
        there and run again on the worker thread (``read``). The hop it saves costs ~70 µs
        of CPU; the bench's session usage is ~1,000 steps.

        SQLite calls the handler every ``LOOKUP_STEPS // 2`` steps as counted across all
        runs of a cached statement, so its first call may come at any step of this run:
        the read is given up at the second call, after between half and all of the
        budget, never before."""
        async with self._limiter:
            conn, over, calls = self._conn, False, 0

            def give_up() -> int:
                nonlocal over, calls
                calls += 1
                over = calls > 1
                return over  # interrupts the statement: an OperationalError, nothing done

            conn.set_progress_handler(give_up, LOOKUP_STEPS // 2)
            try:
                return fn(conn)
            except sqlite3.Error as exc:
                if not over:
                    raise _store_error(exc, self._lock_timeout) from exc
            finally:
                conn.set_progress_handler(None, 0)
        return await self.read(fn)

    def write(self, fn: Callable[[sqlite3.Connection], T]) -> Coroutine[Any, Any, T]:
        """Commit ``fn``'s statements atomically (possibly together with other writes).

        The group commit's own coroutine, not one around it (a driver error reaches the
        writer as ``StoreError`` already: ``_commit_batch`` translates it)."""
        return self._writes.submit(fn)

    async def _commit(self, batch: list[QueuedWrite[SQLiteJob]]) -> None:
        async with self._limiter:
            await anyio.to_thread.run_sync(
                _commit_batch, self._conn, batch, self._lock_timeout, limiter=self._thread
            )
