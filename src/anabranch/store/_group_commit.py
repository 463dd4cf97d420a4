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
  it takes every queued write and commits them. When that commit ends it wakes the first
  writer queued meanwhile (who leads the next commit, overlapping with this batch's
  writers going on with their work), then this batch's writers.
- **One commit at a time.** A batch is committed only when no other is being committed,
  so the backend's ``commit`` never runs twice at once.
- **Cancellation never splits a write.** Queued and committing writes are shielded from
  cancellation: a cancelled caller leaves either its whole write or none of it, and a
  batch is never abandoned half-way.
- **No write hangs.** If ``commit`` itself raises, every write of its batch that has no
  outcome yet fails with that error.

Atomicity and isolation of each write inside a batch (savepoints, retries) and the
translation of driver errors are the backend's part.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio

__all__ = ["GroupCommit", "QueuedWrite"]

J = TypeVar("J")


@dataclass(eq=False)
class QueuedWrite(Generic[J]):
    """One queued write: the backend's job and, once committed, its result or error."""

    job: J
    result: Any = None
    error: BaseException | None = None
    done: bool = False
    wake: anyio.Event | None = None
    """Made when the write has to wait; set when it is committed or should lead next."""

    def reset(self) -> None:
        """Forget an outcome (the backend runs the batch again)."""
        self.result, self.error = None, None


class GroupCommit(Generic[J]):
    """Queues jobs and has the backend's ``commit`` run them in batches, one at a time."""

    def __init__(self, commit: Callable[[list[QueuedWrite[J]]], Awaitable[None]]) -> None:
        self._commit = commit
        self._queue: list[QueuedWrite[J]] = []
        self._committing = False

    async def submit(self, job: J) -> Any:
        """Commit ``job`` (possibly together with other writes); its result, or its error."""
        write = QueuedWrite(job)
        self._queue.append(write)
        with anyio.CancelScope(shield=True):
            while not write.done:
                if self._committing:
                    write.wake = anyio.Event()
                    await write.wake.wait()
                    continue
                await self._commit_queue()
        if write.error is not None:
            raise write.error
        return write.result

    async def _commit_queue(self) -> None:
        self._committing = True
        batch, self._queue = self._queue, []
        try:
            await self._commit(batch)
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
