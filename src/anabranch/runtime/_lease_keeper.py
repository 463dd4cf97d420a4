"""``LeaseKeeper``: one task renews every session lease a ``SessionDriver`` holds.

A session being driven registers its lease (``hold``) with the cancel scope its body runs
in, and gives it back (``drop``) when the body ends. One renewal task per keeper, started
by the first lease held and ended once none is left, renews every held lease each third
of the ttl, all at once. A lease is so renewed within a third of its ttl of being taken or
last renewed, as when each session renewed its own from a task of its own; a process
holding a thousand leases runs one task for them, not a thousand.

What a renewal finds is the session's, as before:

- another owner (this process stalled past the ttl and was taken over): the lease is
  ``lost`` and its session's scope cancelled;
- an error (the store failed): the lease keeps the ``error`` and its scope is cancelled.

``drop`` waits for a renewal of its lease in flight, so what that renewal finds is seen
before the session records its end and gives the lease back.

The renewal task is the event loop's own (asyncio: a task of the running loop; trio: a
system task), in an empty context: it belongs to no session, so it outlives the one that
started it, and keeps nothing of that session alive.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import anyio

from anabranch.store import Store

__all__ = ["HeldLease", "LeaseKeeper"]


class HeldLease:
    """A lease a session holds while its body runs (see ``LeaseKeeper``)."""

    __slots__ = ("error", "lost", "scope", "session_id")

    def __init__(self, session_id: str, scope: anyio.CancelScope) -> None:
        self.session_id = session_id
        self.scope = scope
        """Cancelled when the lease is lost or its renewal failed."""
        self.lost = False
        """A renewal found another owner."""
        self.error: Exception | None = None
        """A renewal failed with this error."""


class LeaseKeeper:
    """Renews the leases ``owner`` holds in ``store``, each third of ``ttl``."""

    def __init__(self, store: Store, owner: str, ttl: float) -> None:
        self._store = store
        self._owner = owner
        self._ttl = ttl
        self._leases: set[HeldLease] = set()
        self._renewing: set[HeldLease] = set()
        """The leases of the renewal in flight."""
        self._renewed: anyio.Event | None = None
        """Set when the renewal in flight has ended."""
        self._wake: anyio.Event | None = None
        """Set when the last lease is dropped: the renewal task ends."""
        self._stopped: anyio.Event | None = None
        """Set when the renewal task has ended (``None``: none is running)."""

    def hold(self, session_id: str, scope: anyio.CancelScope) -> HeldLease:
        """Renew ``session_id``'s lease (just taken) until it is dropped."""
        lease = HeldLease(session_id, scope)
        self._leases.add(lease)
        if self._stopped is None:
            self._stopped = anyio.Event()
            _spawn(self._run)
        return lease

    async def drop(self, lease: HeldLease) -> None:
        """Stop renewing ``lease``, once a renewal of it in flight has ended."""
        self._leases.discard(lease)
        if lease in self._renewing and self._renewed is not None:
            with anyio.CancelScope(shield=True):
                await self._renewed.wait()
        if not self._leases and self._wake is not None:
            self._wake.set()

    async def aclose(self) -> None:
        """Wait for the renewal task to end (it ends once no lease is held)."""
        if self._stopped is not None and not self._leases:
            if self._wake is not None:
                self._wake.set()
            await self._stopped.wait()

    async def _run(self) -> None:
        try:
            while self._leases:
                wake = self._wake = anyio.Event()
                with anyio.move_on_after(self._ttl / 3):
                    await wake.wait()
                if not wake.is_set():
                    await self._renew(list(self._leases))
                # woken: every lease held a period ago has been dropped; any held now
                # is newer, so its first renewal is a whole period on
        except Exception as error:  # never: a failure of the renewals themselves
            for lease in list(self._leases):
                _fail(lease, error)
        finally:
            stopped, self._stopped, self._wake = self._stopped, None, None
            if stopped is not None:
                stopped.set()

    async def _renew(self, leases: list[HeldLease]) -> None:
        self._renewing = set(leases)
        renewed = self._renewed = anyio.Event()
        try:
            with anyio.CancelScope(shield=True):
                async with anyio.create_task_group() as group:
                    for lease in leases:
                        group.start_soon(self._renew_one, lease)
        finally:
            self._renewing = set()
            self._renewed = None
            renewed.set()

    async def _renew_one(self, lease: HeldLease) -> None:
        try:
            held = await self._store.renew_lease(lease.session_id, self._owner, self._ttl)
        except Exception as error:
            _fail(lease, error)
            return
        if not held:
            lease.lost = True
            lease.scope.cancel()


def _fail(lease: HeldLease, error: Exception) -> None:
    lease.error = error
    lease.scope.cancel()


def _spawn(run: Any) -> None:
    """Start ``run()`` as a task of the running event loop's own, in an empty context."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio: anyio's other backend, trio
        import trio

        trio.lowlevel.spawn_system_task(run, context=contextvars.Context())
        return
    task = loop.create_task(run(), context=contextvars.Context())
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)


_TASKS: set[asyncio.Task[None]] = set()
"""The renewal tasks running on asyncio (strong references: the loop keeps weak ones)."""
