"""Sessions as DBOS workflows: enqueue from anywhere, run in ``anabranch worker`` processes.

A session is one DBOS workflow whose id is the session id, enqueued on a DBOS queue (a
durable queue in the same PostgreSQL, schema ``dbos``). The workflow has one step, which
drives the session through ``Runtime.resume``: the write-ahead store keeps the
fine-grained resume inside it (DBOS steps are at-least-once; the store's tool ledger is
what makes a finished tool never run again). DBOS gives dispatch, per-worker and global
concurrency, rate limits, and recovery of a restarted executor's workflows; the worker
(``_worker``) adds failover of a dead executor's workflows.

Needs the ``postgres`` extra; imported only when sessions are submitted or served.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
from dbos import DBOS, DBOSClient

from anabranch.errors import LeaseLostError, SessionBusyError, SessionNotFoundError, UserError

__all__ = [
    "APP_VERSION",
    "DEFAULT_QUEUE",
    "WORKFLOW_NAME",
    "Submitter",
    "redacting_filter",
    "serving_runtime",
    "set_serving_runtime",
]

WORKFLOW_NAME = "anabranch.session"
DEFAULT_QUEUE = "anabranch"
APP_VERSION = "anabranch-session-v1"
"""Pinned DBOS application version: every worker recovers every worker's sessions,
whatever definition files each one imports (DBOS otherwise hashes the workflow code)."""

_serving: list[Any] = []
"""The ``Runtime`` this worker process drives sessions with (one per process)."""


def set_serving_runtime(runtime: Any) -> None:
    _serving[:] = [runtime] if runtime is not None else []


def serving_runtime() -> Any:
    if not _serving:
        raise UserError("this process is not an anabranch worker (no runtime is serving)")
    return _serving[0]


@DBOS.workflow(name=WORKFLOW_NAME, max_recovery_attempts=None)
async def session_workflow(session_id: str) -> str:
    """Drive one session to its end; the session's status, as DBOS's workflow output."""
    status: str = await drive_step(session_id)
    return status


@DBOS.step(name="anabranch.drive")
async def drive_step(session_id: str) -> str:
    return await drive_until_finished(serving_runtime(), session_id)


async def drive_until_finished(runtime: Any, session_id: str) -> str:
    """Resume the session until it is finished. While another live process holds its lease
    (a worker that stalled and came back), wait: it finishes the session, or its lease
    expires and this worker takes over."""
    while True:
        session = await runtime.store.get_session(session_id)
        if session is None:
            raise SessionNotFoundError(session_id)
        if not runtime.defines(session):
            error = (
                f"this worker's definition files define no {session.kind} named "
                f"{session.entry!r}: start the worker with the file that defines it"
            )
            await runtime.store.set_session_status(session_id, "failed", error=error)
            return "failed"
        try:
            result = await runtime.resume(session_id)
        except LeaseLostError:
            raise
        except SessionBusyError:
            await anyio.sleep(runtime.lease_ttl / 3)
            continue
        except Exception:
            after = await runtime.store.get_session(session_id)
            if after is not None and after.status == "failed":
                return "failed"  # the runtime recorded why on the session
            raise
        return str(result.status)


class redacting_filter(logging.Filter):
    """Replaces a secret (a DSN's password) in every log record of a logger."""

    def __init__(self, secret: str | None) -> None:
        super().__init__()
        self.secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secret:
            message = record.getMessage()
            if self.secret in message:
                record.msg, record.args = message.replace(self.secret, "***"), None
        return True


@dataclass
class Submitter:
    """Enqueues sessions from a process that does not run them (``DBOSClient``)."""

    dsn: str
    _client: DBOSClient | None = None

    async def enqueue(self, session_id: str, queue: str) -> None:
        def enqueue() -> None:
            if self._client is None:
                DBOS.migrate(self.dsn)  # a client never creates DBOS's tables itself
                self._client = DBOSClient(system_database_url=self.dsn)
            self._client.enqueue(
                {
                    "workflow_name": WORKFLOW_NAME,
                    "queue_name": queue,
                    "workflow_id": session_id,
                    "app_version": APP_VERSION,
                },
                session_id,
            )

        await anyio.to_thread.run_sync(enqueue)

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await anyio.to_thread.run_sync(client.destroy)
