"""Connections of one ``PostgresStore``: a writer with group commit, and a reader.

psycopg 3's synchronous connections run in worker threads (``anyio.to_thread``), one
statement batch at a time per connection. That runs the same under asyncio and trio:
psycopg's async connections are asyncio-only.

Group commit (``anabranch.store._group_commit.GroupCommit``): writes that arrive while a
transaction is being committed go together into the next one. A batch is committed in
one of two ways, with the same outcome:

- **Pipelined** (first, and almost always): every write's statements, then one fencing
  query for every leased session the batch writes to (``SELECT … FOR SHARE`` of their
  lease rows), are sent in psycopg's pipeline mode without waiting for each other: one
  round trip for the whole batch, no savepoints. Then the lease owners are checked and
  ``COMMIT`` is sent. A result a write needs (an id from ``RETURNING``) is a ``Later``,
  read once the batch's statements have run.
- **One by one**, if anything in the pipelined attempt failed (a write's error, a lost
  lease, a deadlock): it is rolled back whole (nothing of it was committed) and run again
  with each write in its own savepoint, its lease checked first, so one write's error
  rolls back only that write and reaches only its caller. A transaction that loses a
  deadlock or a serialization race is rolled back whole and run again.

Fencing either way: the lease rows are share-locked inside the write's transaction and
checked before ``COMMIT``, so a takeover cannot commit between check and commit; a write
to a session whose lease another owner holds commits nothing and raises
``LeaseLostError``.

No raw driver error escapes: ``psycopg.Error`` becomes ``StoreError`` (the original as
``__cause__``, its text without any DSN password); errors a write raises on purpose
(``LeaseLostError``, ``SessionBusyError``) pass through.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
import anyio.to_thread
import psycopg
import psycopg.errors
from psycopg.rows import dict_row

from anabranch.errors import DatabaseError, LeaseLostError, StoreError
from anabranch.store._dsn import redact_dsn
from anabranch.store._group_commit import GroupCommit, QueuedWrite
from anabranch.store.postgres._schema import SCHEMA

__all__ = ["NOW", "Connections", "Fence", "Later", "Tx", "connect", "store_error"]

NOW = "extract(epoch from clock_timestamp())"
"""The database clock, in seconds, as SQL: leases and heartbeats use it, not the host's."""

T = TypeVar("T")
Conn = psycopg.Connection[dict[str, Any]]
RETRIES = 5
"""How often a batch that lost a deadlock or serialization race is run again."""


Params = Sequence[Any] | Mapping[str, Any]


class Tx:
    """What a write's statements run on: its batch's transaction on the writer connection.

    ``send`` is for statements whose result nobody reads: they share one cursor (a fresh
    cursor per statement costs three times the client CPU); ``execute`` returns a cursor
    of its own to read.
    """

    def __init__(self, conn: Conn) -> None:
        self._conn = conn
        self._cursor = conn.cursor()

    def send(self, sql: str, params: Params = ()) -> None:
        self._cursor.execute(sql, params)

    def send_many(self, sql: str, rows: Sequence[Params]) -> None:
        if len(rows) == 1:
            self._cursor.execute(sql, rows[0])
        elif rows:
            self._cursor.executemany(sql, rows)

    def execute(self, sql: str, params: Params = ()) -> psycopg.Cursor[dict[str, Any]]:
        return self._conn.execute(sql, params)


@dataclass(frozen=True)
class Later(Generic[T]):
    """A write's result that is read once the batch's statements have run."""

    get: Callable[[], T]


@dataclass(frozen=True)
class Fence:
    """The lease a write depends on: ``owner`` must still hold ``session``'s lease."""

    session: str
    owner: str


@dataclass(frozen=True)
class Job:
    """One write: its statements, and the lease it depends on (looked up in the writer's
    thread, since that may need a query)."""

    statements: Callable[[Tx], Any]
    fence: Callable[[Tx], Fence | None] | None = None


Batch = list[QueuedWrite[Job]]
_OWNERS_SQL = "SELECT session_id, owner FROM leases WHERE session_id = ANY(%s) FOR SHARE"
_OWNER_SQL = "SELECT owner FROM leases WHERE session_id = %s FOR SHARE"


class _Fenced(Exception):
    """A lease of the pipelined batch changed hands: run the batch one write at a time."""


def store_error(exc: BaseException) -> BaseException:
    """``exc`` as the store raises it: a driver error becomes a ``StoreError``."""
    if not isinstance(exc, psycopg.Error):
        return exc
    message = redact_dsn(" ".join(str(exc).split()))
    error = StoreError(f"the store failed: {type(exc).__name__}: {message}")
    error.__cause__ = exc
    return error


def connect(
    dsn: str, *, application_name: str = "anabranch", stall_timeout: float | None = None
) -> Conn:
    """A connection with the store's schema first on the search path (autocommit: every
    transaction is explicit).

    ``stall_timeout``: seconds after which the server ends this connection's session if it
    sits inside a transaction waiting for this client (PostgreSQL's
    ``idle_in_transaction_session_timeout``). The store's transactions never wait for
    anything but their own client, so only a frozen process (stopped, swapped out, its
    threads stuck) reaches it; without it such a process keeps its row locks, its lease
    rows among them, for as long as it is frozen, and no one can take its sessions over."""
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
    if stall_timeout is not None:
        milliseconds = max(1, round(stall_timeout * 1000))
        conn.execute(f"SET idle_in_transaction_session_timeout = {milliseconds}")
    return conn


def _resolved(result: Any) -> Any:
    return result.get() if isinstance(result, Later) else result


def _pipelined(conn: Conn, batch: Batch) -> bool:
    """Commit ``batch`` in one pipelined transaction; False (nothing committed, every
    outcome reset) if any part of it failed."""
    fences: dict[str, str] = {}
    try:
        with conn.pipeline() as pipeline:
            tx = Tx(conn)
            tx.send("BEGIN")
            for write in batch:
                job = write.job
                fence = job.fence(tx) if job.fence is not None else None
                if fence is not None:
                    fences[fence.session] = fence.owner
                write.result = job.statements(tx)
            owners = tx.execute(_OWNERS_SQL, (list(fences),)) if fences else None
            pipeline.sync()
            for write in batch:
                write.result = _resolved(write.result)
            if owners is not None:
                held = {row["session_id"]: row["owner"] for row in owners.fetchall()}
                if any(held.get(session, owner) != owner for session, owner in fences.items()):
                    raise _Fenced
            tx.send("COMMIT")
        return True
    except Exception:
        if conn.closed or conn.broken:  # whether COMMIT reached the server is unknown
            raise
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.execute("ROLLBACK")
        for write in batch:
            write.reset()
        return False


def _run_one(tx: Tx, write: QueuedWrite[Job], lost: Callable[[Fence], BaseException]) -> None:
    """One write, its lease checked first (so a fenced write fails as fenced, whatever its
    statements would have met)."""
    job = write.job
    fence = job.fence(tx) if job.fence is not None else None
    if fence is not None:
        row = tx.execute(_OWNER_SQL, (fence.session,)).fetchone()
        if row is not None and row["owner"] != fence.owner:
            raise lost(fence)
    write.result = _resolved(job.statements(tx))


def _one_by_one(conn: Conn, batch: Batch, lost: Callable[[Fence], BaseException]) -> None:
    """Run ``batch`` in one transaction; each write in a savepoint when there are several."""
    tx = Tx(conn)
    for attempt in range(RETRIES):
        try:
            with conn.transaction():
                if len(batch) == 1:
                    _run_one(tx, batch[0], lost)
                else:
                    for write in batch:
                        try:
                            with conn.transaction():
                                _run_one(tx, write, lost)
                        except (
                            psycopg.errors.DeadlockDetected,
                            psycopg.errors.SerializationFailure,
                        ):
                            raise
                        except Exception as exc:
                            write.error = exc
        except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
            for write in batch:
                write.reset()
            if attempt + 1 < RETRIES:
                continue
            raise
        return


def _lease_lost(fence: Fence) -> BaseException:
    return LeaseLostError(fence.session, fence.owner)


class Connections:
    """The writer and reader connections, each used by one thread at a time."""

    def __init__(
        self,
        dsn: str,
        writer: Conn,
        reader: Conn,
        lost: Callable[[Fence], BaseException] = _lease_lost,
        *,
        stall_timeout: float | None = None,
    ) -> None:
        self._dsn = dsn
        self._stall_timeout = stall_timeout
        self._writer = writer
        self._reader = reader
        self.lost = lost
        """The error a write to a session whose lease changed hands raises (the store
        also records the loss)."""
        self._write_thread = anyio.CapacityLimiter(1)
        self._read_thread = anyio.CapacityLimiter(1)
        self._writes: GroupCommit[Job] = GroupCommit(self._commit)
        self.closed = False

    def _usable(self, conn: Conn) -> Conn:
        """``conn``, or a new connection if the server dropped it (a restart, a failover)."""
        if not conn.closed and not conn.broken:
            return conn
        return connect(self._dsn, stall_timeout=self._stall_timeout)

    async def read(self, fn: Callable[[Conn], T]) -> T:
        def run() -> T:
            self._reader = self._usable(self._reader)
            return fn(self._reader)

        return await self._guard(run, self._read_thread)

    async def write(
        self, statements: Callable[[Tx], T], fence: Callable[[Tx], Fence | None] | None = None
    ) -> T:
        """Commit ``statements`` atomically (possibly with other writes), unless ``fence``
        names a lease that is no longer its owner's; their return value."""
        result: T = await self._submit(Job(statements, fence))
        return result

    async def write_later(
        self,
        statements: Callable[[Tx], Later[T]],
        fence: Callable[[Tx], Fence | None] | None = None,
    ) -> T:
        """``write``, for statements whose result is read once the batch has run."""
        result: T = await self._submit(Job(statements, fence))
        return result

    async def _submit(self, job: Job) -> Any:
        try:
            return await self._writes.submit(job)
        except psycopg.Error as exc:
            raise store_error(exc) from exc

    async def _commit(self, batch: Batch) -> None:
        def run() -> None:
            self._writer = self._usable(self._writer)
            if not _pipelined(self._writer, batch):
                _one_by_one(self._writer, batch, self.lost)

        await self._guard(run, self._write_thread)

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
