"""Worker heartbeats (the ``workers`` table), for the failover of dead executors."""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING

from anabranch.store.postgres._connection import NOW, Tx

if TYPE_CHECKING:
    from anabranch.store.postgres._store import PostgresStore

__all__ = ["WorkerRegistry"]


class WorkerRegistry:
    """Heartbeats of worker processes (``workers`` table), for failover of dead ones."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    async def beat(self, executor_id: str, queue: str, *, stopping: bool = False) -> None:
        """Record that ``executor_id`` is alive (or, ``stopping``, that it just stopped:
        its sessions can be recovered at once)."""
        values = {
            "executor_id": executor_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queue": queue,
            "started": time.time(),
        }
        beat = "0" if stopping else NOW

        def write(tx: Tx) -> None:
            tx.send(
                "INSERT INTO workers (executor_id, host, pid, queue, started, heartbeat) VALUES "
                f"(%(executor_id)s, %(host)s, %(pid)s, %(queue)s, %(started)s, {beat}) "
                "ON CONFLICT (executor_id) DO UPDATE SET host = EXCLUDED.host, "
                "pid = EXCLUDED.pid, queue = EXCLUDED.queue, heartbeat = EXCLUDED.heartbeat, "
                "recovered_by = NULL",
                values,
            )

        await self._store._connections.write(write)

    async def dead(self, me: str, dead_after: float) -> list[str]:
        """Executors other than ``me`` whose heartbeat is older than ``dead_after`` seconds
        and whose sessions no live worker has recovered yet."""
        rows = await self._store._all(
            "SELECT executor_id FROM workers WHERE executor_id <> %s AND recovered_by IS NULL "
            f"AND heartbeat < {NOW} - %s ORDER BY heartbeat",
            (me, dead_after),
        )
        return [str(row["executor_id"]) for row in rows]

    async def mark_recovered(self, executor_id: str, by: str, dead_after: float) -> None:
        """Every pending session of ``executor_id`` went back to its queue (unless it came
        back to life meanwhile)."""

        def write(tx: Tx) -> None:
            tx.send(
                "UPDATE workers SET recovered_by = %s WHERE executor_id = %s "
                f"AND heartbeat < {NOW} - %s",
                (by, executor_id, dead_after),
            )

        await self._store._connections.write(write)

    async def expired_leases(self, grace: float, limit: int = 1000) -> list[str]:
        """Unfinished sessions whose lease expired more than ``grace`` seconds ago without
        being released: whoever drove them stopped renewing (stalled or dead). The most
        recently expired first, at most ``limit``."""
        rows = await self._store._all(
            "SELECT l.session_id FROM leases l CROSS JOIN LATERAL (SELECT status FROM "
            "session_events WHERE session_id = l.session_id ORDER BY id DESC LIMIT 1) e "
            f"WHERE l.expires > 0 AND l.expires < {NOW} - %s AND e.status = 'running' "
            "ORDER BY l.expires DESC LIMIT %s",
            (grace, limit),
        )
        return [str(row["session_id"]) for row in rows]
