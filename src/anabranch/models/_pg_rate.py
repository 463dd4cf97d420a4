"""``PostgresCallLimiter``: one model-call rate limit for every process on one PostgreSQL.

A call is granted in one short transaction: lock the limit's row (``FOR UPDATE``: grants
of every process are serialised there), read the database clock, drop the grants that
have left the window, and either insert this call's grant or learn how long to wait. The
clock is the database's, so hosts with skewed clocks share one window. Waiting happens
outside any transaction; in one process the callers queue first come, first served and
only the first of them asks the database.

Not a queue: nothing is enqueued or dispatched; a grant is one row lock and two or three
statements, about a millisecond, where a DBOS queue would add its polling interval to
every model call (see docs/design-notes.md, issue 17).
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.to_thread
import psycopg

from anabranch.models._rate import CallRate, Charge, admission_wait, fits_now
from anabranch.store._dsn import redact_dsn
from anabranch.store.postgres._connection import NOW, Conn, connect, store_error
from anabranch.store.postgres._migrate import migrate

__all__ = ["PostgresCallLimiter"]


class PostgresCallLimiter:
    """A ``CallLimiter`` shared through PostgreSQL (``async with``, or ``open``/``aclose``)."""

    def __init__(self, dsn: str, rate: CallRate, *, stall_timeout: float = 30.0) -> None:
        """``stall_timeout``: seconds after which PostgreSQL ends this limiter's session if
        it sits inside a grant's transaction waiting for this process (a process stopped or
        frozen mid-grant would otherwise keep the limit's row locked, and every process
        sharing the limit would wait on it for as long as it stays frozen)."""
        if not stall_timeout > 0:
            raise ValueError(f"stall_timeout must be > 0 seconds, got {stall_timeout!r}")
        self.rate = rate
        self._dsn = dsn
        self._stall_timeout = stall_timeout
        self._conn: Conn | None = None
        self._turn = anyio.Lock()  # this process's callers, first come first served
        self._use = anyio.Lock()  # one statement batch at a time on the connection

    async def __aenter__(self) -> PostgresCallLimiter:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def open(self) -> None:
        await self._run(lambda conn: None)

    async def aclose(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(conn.close)

    async def acquire(self, charge: Charge) -> int:
        async with self._turn:
            while True:
                wait, ticket = await self._run(lambda conn: self._try_grant(conn, charge))
                if ticket is not None:
                    return int(ticket)
                await anyio.sleep(wait)

    async def settle(self, ticket: int, charge: Charge) -> None:
        await self._run(
            lambda conn: conn.execute(
                "UPDATE call_slots SET tokens = %s, input_tokens = %s, output_tokens = %s "
                "WHERE id = %s",
                (charge.tokens, charge.input, charge.output, ticket),
            )
        )

    async def pause(self, seconds: float) -> None:
        await self._run(
            lambda conn: conn.execute(
                f"UPDATE call_limits SET blocked_until = greatest(blocked_until, {NOW} + %s) "
                "WHERE name = %s",
                (max(seconds, 0.0), self.rate.name),
            )
        )

    def _try_grant(self, conn: Conn, charge: Charge) -> tuple[float, int | None]:
        name, period = self.rate.name, self.rate.period
        with conn.transaction():
            row = conn.execute(
                "SELECT blocked_until FROM call_limits WHERE name = %s FOR UPDATE", (name,)
            ).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO call_limits (name) VALUES (%s) ON CONFLICT DO NOTHING", (name,)
                )
                row = conn.execute(
                    "SELECT blocked_until FROM call_limits WHERE name = %s FOR UPDATE", (name,)
                ).fetchone()
            assert row is not None
            # the clock is read once the row is ours: grants are ordered as they commit
            now = float(_one(conn.execute(f"SELECT {NOW} AS now").fetchone())["now"])
            conn.execute(
                "DELETE FROM call_slots WHERE name = %s AND granted <= %s", (name, now - period)
            )
            blocked_until = float(row["blocked_until"])
            totals = _one(
                conn.execute(
                    "SELECT count(*) AS n, coalesce(sum(input_tokens), 0) AS i, "
                    "coalesce(sum(output_tokens), 0) AS o FROM call_slots WHERE name = %s",
                    (name,),
                ).fetchone()
            )
            used = Charge(int(totals["i"]), int(totals["o"]))
            if blocked_until <= now and fits_now(self.rate, int(totals["n"]), used, charge):
                return 0.0, self._insert(conn, now, charge)
            window = [
                (float(r["granted"]), Charge(int(r["input_tokens"]), int(r["output_tokens"])))
                for r in conn.execute(
                    "SELECT granted, input_tokens, output_tokens FROM call_slots "
                    "WHERE name = %s ORDER BY granted, id",
                    (name,),
                )
            ]
            wait = admission_wait(now, window, self.rate, blocked_until, charge)
            if wait > 0:
                return wait, None
            return 0.0, self._insert(conn, now, charge)

    def _insert(self, conn: Conn, now: float, charge: Charge) -> int:
        granted = conn.execute(
            "INSERT INTO call_slots (name, granted, tokens, input_tokens, output_tokens) "
            "VALUES (%s, %s, %s, %s, %s) RETURNING id",
            (self.rate.name, now, charge.tokens, charge.input, charge.output),
        ).fetchone()
        return int(_one(granted)["id"])

    async def _run(self, fn: Any) -> Any:
        async with self._use:
            return await anyio.to_thread.run_sync(self._call, fn)

    def _call(self, fn: Any) -> Any:
        try:
            if self._conn is None or self._conn.broken or self._conn.closed:
                conn = connect(
                    self._dsn,
                    application_name="anabranch-limiter",
                    stall_timeout=self._stall_timeout,
                )
                migrate(conn, True, redact_dsn(self._dsn))
                # grants are not history: a crash of the server may forget the last few
                # (a few more calls in that window), so a grant need not wait for fsync
                conn.execute("SET synchronous_commit TO off")
                self._conn = conn
            return fn(self._conn)
        except psycopg.Error as exc:
            raise store_error(exc) from None


def _one(row: dict[str, Any] | None) -> dict[str, Any]:
    assert row is not None
    return row
