"""Worker heartbeats (the ``workers`` table), for the failover of dead executors."""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING

import psycopg

from anabranch.store.postgres._connection import NOW, Conn, Tx, connect, store_error

if TYPE_CHECKING:
    from anabranch.store.postgres._store import PostgresStore

__all__ = ["Pulse", "WorkerRegistry"]


def _beat_sql(beat: str) -> str:
    return (
        "INSERT INTO workers (executor_id, host, pid, queue, started, heartbeat) VALUES "
        f"(%(executor_id)s, %(host)s, %(pid)s, %(queue)s, %(started)s, {beat}) "
        "ON CONFLICT (executor_id) DO UPDATE SET host = EXCLUDED.host, "
        "pid = EXCLUDED.pid, queue = EXCLUDED.queue, heartbeat = EXCLUDED.heartbeat, "
        "recovered_by = NULL"
    )


def _worker_row(executor_id: str, queue: str) -> dict[str, object]:
    return {
        "executor_id": executor_id,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "queue": queue,
        "started": time.time(),
    }


# Renew, of ``owner``'s unreleased leases, those due (less than two thirds of the ttl left),
# skipping rows another transaction has locked (this process's own writer, mid-commit: due
# again at the next pulse), so a pulse never waits and never deadlocks with that writer.
_RENEW = (
    f"UPDATE leases SET expires = {NOW} + %(ttl)s WHERE session_id IN (SELECT session_id "
    f"FROM leases WHERE owner = %(owner)s AND expires > 0 AND expires < {NOW} + %(due)s "
    "FOR UPDATE SKIP LOCKED)"
)


class Pulse:
    """A worker's heartbeat and the renewal of its leases on a connection of their own,
    for a thread of their own (``runtime._liveness``): neither waits behind the store's
    writer queue, reader or event loop. Used by one thread at a time."""

    def __init__(self, dsn: str, executor_id: str, queue: str, owner: str, ttl: float) -> None:
        self._dsn = dsn
        self._row = _worker_row(executor_id, queue)
        self._lease = {"owner": owner, "ttl": ttl, "due": ttl * 2 / 3}
        self._conn: Conn | None = None

    def beat(self) -> int:
        """Record the heartbeat, renew the due leases; how many were renewed. Raises the
        driver's error (the connection is opened again on the next beat)."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            conn = self._conn = connect(self._dsn, application_name="anabranch-liveness")
        try:
            conn.execute(_beat_sql(NOW), self._row)
            return conn.execute(_RENEW, self._lease).rowcount
        except psycopg.Error as exc:
            raise store_error(exc) from exc

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class WorkerRegistry:
    """Heartbeats of worker processes (``workers`` table), for failover of dead ones."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    async def beat(self, executor_id: str, queue: str, *, stopping: bool = False) -> None:
        """Record that ``executor_id`` is alive (or, ``stopping``, that it just stopped:
        its sessions can be recovered at once)."""
        values = _worker_row(executor_id, queue)
        sql = _beat_sql("0" if stopping else NOW)

        def write(tx: Tx) -> None:
            tx.send(sql, values)

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
