"""``serve``: one worker process, running queued sessions until it is stopped.

What DBOS does: dequeue sessions from the queue (per-worker and global concurrency, a
rate limit on session starts), run each as a workflow on this process's event loop, and at
launch re-enqueue the sessions this executor id left pending (a restart under systemd or a
StatefulSet keeps its id).

What this adds, because open-source DBOS recovers a dead executor's workflows only when an
executor with the same id comes back: every worker heartbeats into ``workers`` and renews
its leases from a thread and connection of their own while its event loop turns
(``_liveness``: a busy worker is not a dead one); each one looks for executors whose
heartbeat is older than ``dead_after`` and hands their pending sessions back to the queue
with DBOS's own recovery (idempotent: it only moves workflows still pending on the dead
executor). Separately, each one looks for sessions whose lease
expired unreleased (the worker driving them stalled: its event loop stuck, its process
stopped) and hands each such session back the same way, one workflow at a time, whether or
not that worker's heartbeat has expired yet. A worker that stalled and comes back is
fenced by the store: another worker holds its sessions' leases by then, so its writes are
refused.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import sniffio
from dbos import DBOS

from anabranch.errors import StoreError, UserError
from anabranch.runtime._dispatch import (
    APP_VERSION,
    DEFAULT_QUEUE,
    redacting_filter,
    set_serving_runtime,
)
from anabranch.runtime._liveness import Liveness
from anabranch.store.postgres import PostgresStore, Pulse, WorkerRegistry

__all__ = ["WorkerOptions", "default_executor_id", "serve"]

log = logging.getLogger("anabranch.worker")


def default_executor_id() -> str:
    """``$ANABRANCH_EXECUTOR_ID``, else host and pid (not stable across restarts: give
    long-lived workers a stable id so a restart recovers its own sessions at once)."""
    return os.environ.get("ANABRANCH_EXECUTOR_ID") or f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WorkerOptions:
    queue: str = DEFAULT_QUEUE
    concurrency: int = 16
    """Sessions this worker runs at once (DBOS ``worker_concurrency``)."""
    global_concurrency: int | None = None
    """Sessions all workers of the queue run at once (DBOS ``global_concurrency``)."""
    starts_per_period: tuple[int, float] | None = None
    """At most ``limit`` session starts per ``period`` seconds, across workers (DBOS limiter)."""
    executor_id: str = ""
    heartbeat: float = 1.0
    """Seconds between heartbeats (and between looks for dead workers)."""
    dead_after: float | None = None
    """A worker whose heartbeat is older than this is dead (default: the lease ttl)."""
    polling_interval: float = 0.2
    """How often DBOS looks for sessions to start on the queue."""

    def validate(self, lease_ttl: float | None = None) -> None:
        """Raise ``UserError`` for a bad option (``lease_ttl``: the runtime's, if known)."""
        if lease_ttl is not None and self.heartbeat > lease_ttl / 3:
            raise UserError(
                f"--heartbeat ({self.heartbeat:g} s) must be at most a third of --lease-ttl "
                f"({lease_ttl:g} s): each beat renews the worker's leases"
            )
        if not self.queue or not self.queue.replace("-", "").replace("_", "").isalnum():
            raise UserError(f"queue names are letters, digits, '-' and '_', got {self.queue!r}")
        if self.concurrency < 1:
            raise UserError(f"--concurrency must be at least 1, got {self.concurrency}")
        if self.global_concurrency is not None and self.global_concurrency < 1:
            raise UserError("the global concurrency must be at least 1")
        if self.heartbeat <= 0:
            raise UserError("the heartbeat interval must be positive")
        if self.dead_after is not None and self.dead_after <= 0:
            raise UserError("--dead-after must be positive")


async def serve(
    runtime: Any,
    dsn: str,
    options: WorkerOptions,
    *,
    on_ready: Callable[[str], None] | None = None,
    stop: anyio.Event | None = None,
) -> None:
    """Run queued sessions with ``runtime`` (open, on PostgreSQL) until ``stop`` is set."""
    options.validate(runtime.lease_ttl)
    if sniffio.current_async_library() != "asyncio":
        raise UserError("anabranch worker runs on asyncio only (DBOS runs workflows on asyncio)")
    store = runtime.store
    if not isinstance(store, PostgresStore):
        raise UserError("anabranch worker needs a PostgreSQL database (--db postgresql://...)")
    executor_id = options.executor_id or default_executor_id()
    dead_after = options.dead_after if options.dead_after is not None else runtime.lease_ttl
    registry = WorkerRegistry(store)
    await registry.beat(executor_id, options.queue)
    pulse = Pulse(dsn, executor_id, options.queue, runtime._owner, runtime.lease_ttl)
    # the loop may lag up to half a lease: its leases still have the other half to run
    liveness = Liveness(pulse, interval=options.heartbeat, stall_after=runtime.lease_ttl / 2)
    _quiet_dbos_logs(dsn)
    DBOS(
        config={
            "name": "anabranch",
            "system_database_url": dsn,
            "executor_id": executor_id,
            "application_version": APP_VERSION,
            "log_level": "WARNING",
            # as the store's stall timeout: a frozen worker's DBOS transactions (a step
            # being recorded, a dequeue) must not keep their locks past its leases
            "sys_db_idle_transaction_timeout_sec": runtime.lease_ttl,
        }
    )
    set_serving_runtime(runtime)
    try:
        DBOS.launch()  # on this loop: DBOS then runs the queue's workflows here
        limiter = None
        if options.starts_per_period is not None:
            limit, period = options.starts_per_period
            limiter = {"limit": limit, "period": period}
        await DBOS.register_queue_async(
            options.queue,
            worker_concurrency=options.concurrency,
            global_concurrency=options.global_concurrency,
            limiter=limiter,  # type: ignore[arg-type]
            polling_interval_sec=options.polling_interval,
            on_conflict="always_update",
        )
        liveness.start()
        if on_ready is not None:
            on_ready(executor_id)
        async with anyio.create_task_group() as group:
            group.start_soon(_look_for_the_dead, registry, executor_id, options, dead_after)
            await (stop or anyio.Event()).wait()
            group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(liveness.stop)  # before the stopping beat below
            await anyio.to_thread.run_sync(_destroy)
            set_serving_runtime(None)
            # hand this worker's unfinished sessions to the others at once
            await registry.beat(executor_id, options.queue, stopping=True)


def _destroy() -> None:
    DBOS.destroy(destroy_registry=False)


async def _look_for_the_dead(
    registry: WorkerRegistry, executor_id: str, options: WorkerOptions, dead_after: float
) -> None:
    """Every heartbeat interval, on the loop (this worker's own heartbeat is ``Liveness``'s,
    on a thread: a slow look here delays only the recovery of others)."""
    while True:
        try:
            await _recover_the_dead(registry, executor_id, dead_after)
        except StoreError as error:
            # e.g. this process was frozen and the server ended its connection (the store's
            # stall timeout): the next look reconnects
            log.warning("looking for dead workers failed, trying again: %s", error)
        await anyio.sleep(options.heartbeat)


async def _recover_the_dead(registry: WorkerRegistry, executor_id: str, dead_after: float) -> None:
    for dead in await registry.dead(executor_id, dead_after):
        handles = await anyio.to_thread.run_sync(_recover, dead)
        log.warning("worker %s is dead: %d sessions back on the queue", dead, handles)
        await registry.mark_recovered(dead, executor_id, dead_after)
    expired = await registry.expired_leases(grace=0.0)
    if expired:
        moved = await anyio.to_thread.run_sync(_recover_sessions, expired, executor_id)
        for session_id, holder in moved:
            log.warning("session %s: lease expired on %s; back on the queue", session_id, holder)


def _recover(executor_id: str) -> int:
    """DBOS's recovery of another executor's pending workflows: each goes back to its
    queue only if it is still pending on that executor, so two workers recovering the
    same dead one (or the dead one restarting) never run a session twice."""
    return len(DBOS._recover_pending_workflows([executor_id]))


def _recover_sessions(session_ids: list[str], me: str) -> list[tuple[str, str]]:
    """Hand sessions whose lease expired back to the queue, each whose workflow is still
    pending on another executor (one that stalled: its heartbeat may still be fresh, or
    stop only later). DBOS's own per-workflow recovery step, as in ``_recover``: it moves
    a workflow only while it is pending on that executor, so it is idempotent, and it
    clears the old run's ownership, so a stalled run that comes back records nothing in
    DBOS either. Sessions with no pending workflow (run by ``anabranch run``, or already
    moved) are left alone. Returns (session, executor it was taken from) for each moved."""
    from dbos._dbos import _get_dbos_instance
    from dbos._utils import INTERNAL_QUEUE_NAME

    pending = DBOS.list_workflows(
        workflow_ids=session_ids, status="PENDING", load_input=False, load_output=False
    )
    system_db = _get_dbos_instance()._sys_db
    moved = []
    for workflow in pending:
        holder = workflow.executor_id
        if not holder or holder == me:
            continue
        if system_db.reenqueue_for_recovery(workflow.workflow_id, [holder], INTERNAL_QUEUE_NAME):
            moved.append((workflow.workflow_id, holder))
    return moved


def _quiet_dbos_logs(dsn: str) -> None:
    from anabranch.store import redact_dsn

    password = None
    redacted = redact_dsn(dsn)
    if redacted != dsn:
        import urllib.parse

        password = urllib.parse.urlsplit(dsn).password
    secret = redacting_filter(password)
    for name in ("dbos", "sqlalchemy"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, redacting_filter) for f in logger.filters):
            logger.addFilter(secret)
