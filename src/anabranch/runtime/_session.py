"""``SessionDriver``: the one place a session is driven, agent and graph sessions alike.

Driving a session, in order:

1. Refuse if this runtime already drives it (``SessionBusyError``), then take its lease in
   the store (another live process has it: ``SessionBusyError``).
   Under the lease, ask the caller whether the session has ended meanwhile (another
   process finished it after the caller last read it: a duplicate or recovered DBOS
   workflow meets this): then write nothing but a missing end, give the lease back and
   return that end. A finished session is never re-opened.
2. Record ``running`` (with the lease, in its transaction, when there was nothing to ask
   in step 1) and run the body, while the driver's ``LeaseKeeper`` renews the lease every
   third of its ttl (one task renews every lease the driver holds).
3. The body returns how the session ended (``SessionEnd``); an exception from it is a
   ``failed`` end carrying the exception (``ApprovalPendingError``: a ``waiting`` end, the
   session paused until the approval is answered). Record that status, in the same
   transaction that gives the lease back.
4. Cleanup is shielded from cancellation: a cancelled drive records ``cancelled`` and
   always releases the lease.
5. Lease loss (a renewal finds another owner: this process stalled past its ttl and was
   taken over) cancels the body and writes nothing more: ``LeaseLostError``. A renewal
   that fails cancels the body too, and the drive raises its error.

Each drive is announced on the runtime's event bus (``session_started`` first,
``session_finished`` with the result last), and ``on_event`` is fed from a task of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypedDict, TypeVar

import anyio

from anabranch.errors import (
    AnabranchError,
    ApprovalPendingError,
    LeaseLostError,
    SessionBusyError,
)
from anabranch.runtime._event_stream import SessionAnnouncer
from anabranch.runtime._events import EventBus, EventCallback
from anabranch.runtime._lease_keeper import HeldLease, LeaseKeeper
from anabranch.runtime._results import RunResult, SessionStatus
from anabranch.store import SessionRecord, Store

__all__ = ["SessionDriver", "SessionEnd"]

R = TypeVar("R", bound=RunResult)


@dataclass(frozen=True)
class SessionEnd:
    """How a drive of a session ended."""

    status: SessionStatus
    output: str = ""
    error: str | None = None
    cause: BaseException | None = None
    """The exception that failed the session, when it happened in this drive."""

    @classmethod
    def failure(cls, exc: BaseException, output: str = "") -> SessionEnd:
        return cls("failed", output=output, error=str(exc) or type(exc).__name__, cause=exc)


class _EndStatus(TypedDict):
    status: SessionStatus
    output: str | None
    error: str | None


class _Held:
    """A held lease: the session end to record as it is given back, if any."""

    __slots__ = ("end",)

    def __init__(self) -> None:
        self.end: SessionEnd | None = None


class SessionDriver:
    """Drives sessions of one runtime: leases, renewal, status events, cleanup."""

    def __init__(
        self,
        store: Store,
        owner: str,
        lease_ttl: float,
        *,
        events: EventBus,
        on_event: EventCallback | None = None,
    ) -> None:
        self.store = store
        self.owner = owner
        self.lease_ttl = lease_ttl
        self.events = events
        self.on_event = on_event
        self._driving: set[str] = set()
        self._keeper = LeaseKeeper(store, owner, lease_ttl)

    async def aclose(self) -> None:
        """Wait for the lease renewals to end (once no session is being driven)."""
        await self._keeper.aclose()

    @asynccontextmanager
    async def lease(self, session_id: str) -> AsyncIterator[None]:
        """Hold the session's lease for a short piece of work (no renewal)."""
        async with self._held(session_id):
            yield

    @asynccontextmanager
    async def opening(self, session: SessionRecord) -> AsyncIterator[None]:
        """Commit a new session with its lease (and ``running``) in one write, for a
        ``drive(..., taken=True)`` right after the block. The lease is given back if the
        block raises."""
        await self.store.create_session(session, owner=self.owner, ttl=self.lease_ttl)
        self._driving.add(session.id)
        try:
            yield
        except BaseException:
            self._driving.discard(session.id)
            with anyio.CancelScope(shield=True):
                await self.store.release_lease(session.id, self.owner)
            raise

    @asynccontextmanager
    async def _held(
        self, session_id: str, *, running: bool = False, taken: bool = False
    ) -> AsyncIterator[_Held]:
        """``lease``. ``running``: record the session running with the lease (one write).
        ``taken``: ``opening`` took it. An end set on the yielded ``_Held`` is recorded as
        the lease is given back, in the same write."""
        if not taken:
            if session_id in self._driving:
                raise SessionBusyError(session_id, f"this runtime ({self.owner})")
            await self.store.acquire_lease(session_id, self.owner, self.lease_ttl, running=running)
            self._driving.add(session_id)
        held = _Held()
        try:
            yield held
        finally:
            self._driving.discard(session_id)
            with anyio.CancelScope(shield=True):
                await self._release(session_id, held.end)

    async def _release(self, session_id: str, end: SessionEnd | None) -> None:
        """Give the lease back (recording ``end`` first, in the same transaction)."""
        if end is None:
            await self.store.release_lease(session_id, self.owner)
            return
        try:
            end_status = self._end_status(session_id, end)
            await self.store.release_lease(session_id, self.owner, **end_status)
        except BaseException:  # the end was not recorded: still give the lease back
            await self.store.release_lease(session_id, self.owner)
            raise

    async def drive(
        self,
        session_id: str,
        body: Callable[[], Awaitable[SessionEnd]],
        *,
        result: Callable[[SessionEnd], Awaitable[R]],
        task: str = "",
        resumed: bool = False,
        ended: Callable[[], Awaitable[SessionEnd | None]] | None = None,
        taken: bool = False,
    ) -> R:
        """Drive ``session_id`` through ``body`` under its lease, record its end and return
        ``result(end)``, announcing the drive on the event bus. ``ended``: read under the
        lease before anything is written, the session's end if it has one already (then
        ``body`` does not run). ``taken``: the session was just committed with its lease,
        and recorded running (``opening``).

        Raises:
            SessionBusyError: another driver (here or in another process) has the session.
            LeaseLostError: the lease was taken over while the body ran.
        """
        async with SessionAnnouncer(self.events, session_id, self.on_event) as announcer:
            announcer.started(task, resumed=resumed)
            try:
                end = await self._drive_leased(session_id, body, ended, taken)
                outcome = await result(end)
            except BaseException as error:
                announcer.failed(error)
                raise
            announcer.finished(outcome)
            return outcome

    async def _drive_leased(
        self,
        session_id: str,
        body: Callable[[], Awaitable[SessionEnd]],
        ended: Callable[[], Awaitable[SessionEnd | None]] | None,
        taken: bool,
    ) -> SessionEnd:
        store = self.store
        end: SessionEnd | None = None
        lease: HeldLease | None = None
        # with nothing to read under the lease first, ``running`` is written with it
        async with self._held(session_id, running=ended is None, taken=taken) as held:
            already = await ended() if ended is not None else None
            if already is not None:
                if not await self._shows(session_id, already):
                    held.end = already  # its process stopped before: recorded with the release
                return already
            try:
                if ended is not None:
                    await store.set_session_status(session_id, "running")
                with anyio.CancelScope() as scope:  # cancelled if the lease is lost
                    lease = self._keeper.hold(session_id, scope)
                    try:
                        end = await body()
                    except ApprovalPendingError as pending:  # paused, not failed
                        end = SessionEnd("waiting", error=str(pending), cause=pending)
                    except Exception as exc:
                        end = SessionEnd.failure(exc)
                    finally:
                        await self._keeper.drop(lease)
            except anyio.get_cancelled_exc_class():
                if lease is None or not lease.lost:
                    with anyio.CancelScope(shield=True):
                        await store.set_session_status(session_id, "cancelled", error="cancelled")
                raise
            assert lease is not None  # held before the body ran
            if lease.error is not None:  # the lease could not be renewed
                raise lease.error
            if lease.lost or isinstance(end and end.cause, LeaseLostError):
                # another process owns the session now (a renewal or a fenced write found
                # out): write nothing more
                raise LeaseLostError(session_id, self.owner)
            assert end is not None
            held.end = end  # recorded as the lease is given back, in the same write
        return end

    async def settle(self, session_id: str, end: SessionEnd) -> None:
        """Record ``end``, the end of a session whose root has ended, unless the session
        shows it by the time its lease is held. The caller read the session without the
        lease: the process that ended it may have recorded its status since (a duplicate
        DBOS workflow of a session another worker was finishing meets this), and an end
        recorded twice is a write after the session finished."""
        async with self._held(session_id) as held:
            if not await self._shows(session_id, end):
                held.end = end  # recorded as the lease is given back, in the same write

    async def _shows(self, session_id: str, end: SessionEnd) -> bool:
        """Whether the store shows the session ended as ``end`` (read under its lease)."""
        session = await self.store.get_session(session_id)
        return session is not None and session.status == end.status and bool(session.finished)

    @staticmethod
    def _end_status(session_id: str, end: SessionEnd) -> _EndStatus:
        """What recording ``end`` writes (its error told which session it failed)."""
        if isinstance(end.cause, AnabranchError):
            end.cause.session_id = session_id
        output = end.output if end.status in ("done", "incomplete") else None
        return {"status": end.status, "output": output, "error": end.error}
