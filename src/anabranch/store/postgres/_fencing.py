"""``FencedWrites``: the write path of ``PostgresStore``, fenced by the leases it holds.

Once another process has taken over a session this store held a lease on, every further
write of this store for that session raises ``LeaseLostError`` and commits nothing. The
check runs in the write's transaction under a share lock on the lease row, so a takeover
cannot slip in between check and commit (``_connection``: one check per batch for every
leased session it writes to, pipelined with the writes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from anabranch.errors import LeaseLostError
from anabranch.store.postgres._connection import Connections, Fence, Later, Tx
from anabranch.store.postgres._reads import Reads

__all__ = ["FencedWrites"]

T = TypeVar("T")


class FencedWrites(Reads):
    """The leases this store holds (and lost), and ``_write``: a commit fenced by them."""

    def __init__(self, connections: Connections) -> None:
        super().__init__(connections)
        connections.lost = self._lease_lost
        self._held: dict[str, str] = {}
        """Sessions this store holds a lease on, and the owner it took them for."""
        self._lost: set[str] = set()
        """Sessions another process took over from this store: writes for them are refused."""
        self._run_sessions: dict[str, str] = {}
        self._call_runs: dict[int, str] = {}

    def _known_session(self, *, run: str | None, call: int | None) -> str | None:
        """The session of ``run`` (or of ``call``'s run) if this store has seen it."""
        if call is not None and run is None:
            run = self._call_runs.get(call)
        return self._run_sessions.get(run) if run is not None else None

    def _session_of(self, tx: Tx, *, run: str | None, call: int | None) -> str | None:
        if call is not None and run is None:
            run = self._call_runs.get(call)
            if run is None:
                row = tx.execute("SELECT run_id FROM calls WHERE id = %s", (call,)).fetchone()
                run = row["run_id"] if row else None
        if run is None:
            return None
        session = self._run_sessions.get(run)
        if session is None:
            row = tx.execute("SELECT session_id FROM runs WHERE id = %s", (run,)).fetchone()
            session = row["session_id"] if row else None
            if session is not None:
                self._run_sessions[run] = session
        return session

    def _lease_lost(self, fence: Fence) -> LeaseLostError:
        """Record that another owner took ``fence.session`` over (writer thread)."""
        self._let_go(fence.session, lost=True)
        return LeaseLostError(fence.session, fence.owner)

    def _let_go(self, session: str, *, lost: bool) -> None:
        """``session``'s lease is no longer held (``lost``: another owner took it over).
        Lost before no longer held: a fence read on another thread in between finds it in
        one of the two, never in neither (then a write would go unfenced)."""
        if lost:
            self._lost.add(session)
        self._held.pop(session, None)

    def _fence(
        self, session: str | None, run: str | None, call: int | None
    ) -> Callable[[Tx], Fence | None] | None:
        """What a write to ``session`` (or ``run``'s or ``call``'s) must check: the lease
        this store holds on it (looked up when the write runs), or nothing."""
        if not (self._held or self._lost):
            return None
        known = session or self._known_session(run=run, call=call)
        if known is not None and known in self._lost:
            raise LeaseLostError(known, "this store")

        def fence(tx: Tx) -> Fence | None:
            target = known or self._session_of(tx, run=run, call=call)
            if target is None:
                return None
            if target in self._lost:
                raise LeaseLostError(target, "this store")
            owner = self._held.get(target)
            return Fence(target, owner) if owner is not None else None

        return fence

    async def _write(
        self,
        fn: Callable[[Tx], T],
        *,
        session: str | None = None,
        run: str | None = None,
        call: int | None = None,
    ) -> T:
        """Commit ``fn`` unless the session it writes to was taken over from this store."""
        return await self._connections.write(fn, self._fence(session, run, call))

    async def _write_later(
        self, fn: Callable[[Tx], Later[T]], *, run: str | None = None, session: str | None = None
    ) -> T:
        """``_write`` for statements whose result is read once the batch has run."""
        return await self._connections.write_later(fn, self._fence(session, run, None))

    def _hold(self, session_id: str, owner: str) -> None:
        """This store holds ``session_id``'s lease (again) for ``owner``."""
        self._held[session_id] = owner
        self._lost.discard(session_id)
