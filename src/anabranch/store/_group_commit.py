"""``GroupCommit``: the leader/follower queue both stores commit their writes through.

A backend hands it one coroutine function, ``commit(batch)``, that runs a list of queued
writes in one transaction on its single writer connection and sets each write's
``result`` or ``error``. ``GroupCommit`` decides who runs it and when.

Invariants (the stores' correctness rests on them; the conformance suite checks each):

- **A write returns only once it is committed.** ``submit(job)`` queues the job and
  returns its result once the transaction holding it has committed, or raises its error
  (the job's own, or the transaction's) once that transaction has rolled back.
- **Group commit.** Writes that arrive while a transaction is being committed wait and go
  together into the next one: one commit (one fsync) for the whole batch.
- **Leader/follower, nobody polls.** The first writer to find no commit in progress leads:
  it takes every queued write and commits them. The first writer queued during a commit
  is the next batch's leader; when the commit ends it wakes that one (who leads the next
  commit, overlapping with this batch's writers going on with their work), then this
  batch's writers, **all through one wake-up per batch** (not one per write: the batch's
  ``_Wake``, set once, resolves what each of its waiters awaits).
- **One commit at a time.** A batch is committed only when no other is being committed,
  so the backend's ``commit`` never runs twice at once.
- **Cancellation never splits a write.** Queued and committing writes are shielded from
  cancellation: a cancelled caller still waits until its write is committed (or has
  failed), then sees its cancellation; a batch is never abandoned half-way. (Only a
  leader and a cancelled waiter pay for a shielded scope.)
- **No write hangs.** If ``commit`` itself raises, every write of its batch that has no
  outcome yet fails with that error.

A write in flight is cheap to keep (a batch waits for a thread; every young collection
meanwhile walks what its writers hold): a follower waits in ``submit``'s own frame on
what its batch's wake-up resolves (on asyncio a bare future, as ``asyncio.Event`` would
make, without its coroutine or anyio's), not in a chain of coroutines.

Atomicity and isolation of each write inside a batch (savepoints, retries) and the
translation of driver errors are the backend's part.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import anyio

__all__ = ["GroupCommit", "QueuedWrite"]

J = TypeVar("J")


class QueuedWrite(Generic[J]):
    """One queued write: the backend's job and, once committed, its result or error."""

    __slots__ = ("done", "error", "job", "result")

    def __init__(self, job: J) -> None:
        self.job = job
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False

    def reset(self) -> None:
        """Forget an outcome (the backend runs the batch again)."""
        self.result, self.error = None, None


class _Wake:
    """One wake-up for many waiters, set once (``asyncio.Event`` without its coroutine).

    On asyncio each waiter awaits a future of its own (so cancelling one waiter cancels
    only its future); elsewhere (trio) an ``anyio.Event``'s ``wait``.
    """

    __slots__ = ("_event", "_futures", "is_set")

    def __init__(self) -> None:
        self.is_set = False
        self._futures: list[asyncio.Future[None]] | None = None
        self._event: anyio.Event | None = None

    def park(self) -> Awaitable[Any]:
        """What a waiter awaits until ``set``."""
        if self.is_set:  # would never be resolved: a broken invariant, not a hang
            raise AssertionError("group commit: waiting on a wake-up already given")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio
            if self._event is None:
                self._event = anyio.Event()
            return self._event.wait()
        future: asyncio.Future[None] = loop.create_future()
        if self._futures is None:
            self._futures = [future]
        else:
            self._futures.append(future)
        return future

    def set(self) -> None:
        self.is_set = True
        for future in self._futures or ():
            if not future.done():  # a cancelled waiter's is
                future.set_result(None)
        self._futures = None
        if self._event is not None:
            self._event.set()


class _Batch(Generic[J]):
    """The writes of one transaction, and the two wake-ups its writers wait on."""

    __slots__ = ("committed", "lead", "leader", "writes")

    def __init__(self) -> None:
        self.writes: list[QueuedWrite[J]] = []
        self.leader: QueuedWrite[J] | None = None
        """The first write queued while another batch commits: it leads this one."""
        self.lead: _Wake | None = None
        """Set when the commit before this batch has ended (the leader's turn)."""
        self.committed: _Wake | None = None
        """Set when this batch's commit has ended (every other writer's wake-up)."""


class GroupCommit(Generic[J]):
    """Queues jobs and has the backend's ``commit`` run them in batches, one at a time."""

    def __init__(self, commit: Callable[[list[QueuedWrite[J]]], Awaitable[None]]) -> None:
        self._commit = commit
        self._next: _Batch[J] = _Batch()
        """The batch that writes join: committed next."""
        self._committing = False

    async def submit(self, job: J) -> Any:
        """Commit ``job`` (possibly together with other writes); its result, or its error."""
        write = QueuedWrite(job)
        batch = self._next
        batch.writes.append(write)
        if not self._committing:
            await self._lead(batch)
        else:
            try:
                while not write.done:
                    await self._next_step(write, batch)
            except BaseException:  # cancelled while queued: the write is not abandoned
                with anyio.CancelScope(shield=True):
                    while not write.done:
                        await self._next_step(write, batch)
                raise
        if write.error is not None:
            raise write.error
        return write.result

    def _next_step(self, write: QueuedWrite[J], batch: _Batch[J]) -> Awaitable[Any]:
        """What ``write`` (of ``batch``, not yet committed) awaits next: leading its batch
        if it is the leader (or nothing is being committed), else its batch's wake-up.
        Only the leading is shielded (by ``_lead``)."""
        if not self._committing:  # then ``batch`` is still the next one: commit it
            return self._lead(batch)
        if batch is self._next and batch.leader in (None, write):
            if batch.lead is None:
                batch.leader, batch.lead = write, _Wake()
            elif batch.lead.is_set:  # never: a leader takes ``_next`` when woken
                raise AssertionError("group commit: woken to lead while a commit runs")
            return batch.lead.park()
        # another writer leads this batch, or is committing it
        if batch.committed is None:
            batch.committed = _Wake()
        return batch.committed.park()

    async def _lead(self, batch: _Batch[J]) -> None:
        """Commit ``batch`` (the next one, while nothing else commits); wake its writers.
        Shielded: a leader's cancellation never abandons its batch half-way."""
        with anyio.CancelScope(shield=True):
            self._committing = True
            self._next = _Batch()
            writes = batch.writes
            try:
                await self._commit(writes)
            except BaseException as exc:  # the transaction failed: fail its writes, not hang
                for write in writes:
                    write.error = write.error or exc
            finally:
                for write in writes:
                    write.done = True
                self._committing = False
                following = self._next
                if following.lead is not None:
                    following.lead.set()
                if batch.committed is not None:
                    batch.committed.set()
