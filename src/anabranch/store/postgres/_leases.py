"""The statements that take a session's lease on PostgreSQL (run inside a batch's ``Tx``)."""

from __future__ import annotations

from anabranch._process import pid_alive
from anabranch.errors import SessionBusyError
from anabranch.store.postgres._connection import NOW, Tx

__all__ = ["take_lease"]


def take_lease(tx: Tx, session_id: str, owner: str, host: str, pid: int, ttl: float) -> None:
    """Take the session's lease for ``owner`` (a new epoch when it changes hands), or raise
    ``SessionBusyError`` if a live owner has it."""
    # never wait for a lease row another transaction has locked: its holder may be
    # frozen mid-commit (until the server ends it, see ``stall_timeout``), and a
    # wait here would stop this store's every write with it
    row = tx.execute(
        f"SELECT owner, host, pid, expires, {NOW} AS now FROM leases "
        "WHERE session_id = %s FOR UPDATE SKIP LOCKED",
        (session_id,),
    ).fetchone()
    if row is None and tx.execute(
        "SELECT 1 FROM leases WHERE session_id = %s", (session_id,)
    ).fetchone():
        raise SessionBusyError(session_id, "a process committing to it")
    values = {"session_id": session_id, "owner": owner, "host": host, "pid": pid, "ttl": ttl}
    if row is None:
        tx.send(
            "INSERT INTO leases (session_id, owner, host, pid, expires) VALUES "
            f"(%(session_id)s, %(owner)s, %(host)s, %(pid)s, {NOW} + %(ttl)s)",
            values,
        )
        return
    if row["owner"] != owner:
        dead = row["host"] == host and row["pid"] != pid and not pid_alive(row["pid"])
        if row["expires"] > row["now"] and not dead:
            raise SessionBusyError(session_id, f"{row['owner']} on {row['host']}")
    tx.send(
        "UPDATE leases SET owner = %(owner)s, host = %(host)s, pid = %(pid)s, "
        f"expires = {NOW} + %(ttl)s, epoch = epoch + 1 WHERE session_id = %(session_id)s",
        values,
    )
