"""What a finished session hands back, and the one place results are built.

The failure rule (one for ``run``, ``resume`` and ``run_graph``): a session that runs and
fails returns a result with ``status="failed"`` and ``error``, like an HTTP response with
an error status; ``raise_for_status()`` turns it into ``RunFailedError``. What raises
instead is what stops the session from being driven at all: bad input (``UserError``),
another driver (``SessionError``), the store failing (``StoreError``), cancellation.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, PrivateAttr

from anabranch.errors import ApprovalPendingError, RunFailedError
from anabranch.messages import Usage
from anabranch.runtime._report import summarizer_usage
from anabranch.store import Store

__all__ = [
    "GraphResult",
    "RunResult",
    "SessionStatus",
    "TaskResult",
    "TaskStatus",
    "build_result",
    "session_usage",
]

SessionStatus = Literal["done", "incomplete", "failed", "waiting"]
"""``waiting``: paused until a pending tool approval is answered (then ``resume``);
``incomplete``: a limit stopped the session and its result is the report it wrote."""


class RunResult(BaseModel):
    """The outcome of ``Runtime.run`` / ``Runtime.resume``: check ``status`` or call
    ``raise_for_status()``."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    run_id: str
    agent: str
    status: SessionStatus
    output: Any
    """The final answer: its text, or, for an agent with an ``output_type``, an instance of
    that model, validated (the text when the run failed)."""
    usage: Usage
    """Token usage of the whole session (every agent run in it)."""
    error: str | None = None
    incomplete: bool = False
    """A limit stopped the session's root run (for a graph: some task) and ``output`` is
    the report it wrote at that point: the work is not finished (``status`` is ``done``)."""
    stop_reason: str | None = None
    """Which limit: ``max_turns``, ``timeout`` or ``budget``; ``None`` when none did."""
    _cause: BaseException | None = PrivateAttr(default=None)

    @property
    def ok(self) -> bool:
        return self.status == "done"

    def raise_for_status(self) -> Self:
        """Return the result if the session is done; raise ``RunFailedError`` (chained to
        the original exception, when it happened in this process) if it failed, and
        ``ApprovalPendingError`` (naming the waiting calls) if it waits for an approval."""
        if self.status == "failed":
            raise RunFailedError(self) from self._cause
        if self.status == "waiting":
            if isinstance(self._cause, ApprovalPendingError):
                raise self._cause
            pending = ApprovalPendingError([])
            pending.session_id = self.session_id
            raise pending
        return self


TaskStatus = Literal["done", "incomplete", "failed", "cancelled"]


class TaskResult(BaseModel):
    """How one task of a graph ended."""

    model_config = ConfigDict(frozen=True)

    id: str
    agent: str
    status: TaskStatus
    """``failed`` also covers a task that never ran because a dependency failed
    (``run_id`` is then None); ``cancelled``: stopped by ``fail_fast``; ``incomplete``: a
    limit stopped it and ``report`` is what it had found (its dependents receive it)."""
    report: str = ""
    """The task's final answer (in full; dependents receive it capped)."""
    run_id: str | None = None
    error: str | None = None
    """Why it failed; for an incomplete task, which limit stopped it."""
    stop_reason: str | None = None
    """For an incomplete task: ``max_turns``, ``timeout`` or ``budget``."""


class GraphResult(RunResult):
    """The outcome of ``Runtime.run_graph`` (also returned by ``resume`` for a graph).

    ``output`` is the report of the graph's final task (or the reports of all tasks
    nothing depends on, each under its id); ``run_id`` is empty (a graph has no root run).
    """

    tasks: dict[str, TaskResult]

    @property
    def failed(self) -> list[str]:
        """Ids of the tasks that did not finish (failed or cancelled; not incomplete ones,
        which ended with a report)."""
        return [t.id for t in self.tasks.values() if t.status in ("failed", "cancelled")]


async def session_usage(store: Store, session_id: str, run_id: str | None = None) -> Usage:
    """Tokens paid in the session (or one run): agent calls plus summarizer calls.

    Agent calls are summed in SQL (a long session costs no rows in Python)."""
    sums = await store.sum_call_usage(session_id, tuple(Usage.model_fields), run_id=run_id)
    total = Usage(**sums)
    for boundary in await store.list_boundaries(session_id=session_id):
        if run_id is None or boundary.run_id == run_id:
            summarizer = summarizer_usage(boundary)
            if summarizer is not None:
                total = total + summarizer
    return total


async def build_result(
    store: Store,
    session_id: str,
    *,
    run_id: str,
    agent: str,
    status: SessionStatus,
    output: str | None,
    error: str | None = None,
    cause: BaseException | None = None,
    tasks: dict[str, TaskResult] | None = None,
    output_type: type[BaseModel] | None = None,
    stop_reason: str | None = None,
) -> RunResult:
    """The result of a session (a ``GraphResult`` when ``tasks`` are given), with the
    session's usage read from the store. Every result is built here. With ``output_type``
    a finished session's output is that model, validated from its JSON.

    An ``incomplete`` session is ``done`` with ``incomplete`` set (``stop_reason`` says
    which limit; for a graph, its first incomplete task's); its output is the report it
    wrote when it was stopped (text, never validated)."""
    typed: Any = output or ""
    if output_type is not None and status == "done" and output:
        typed = output_type.model_validate_json(output)
    stopped = [t for t in (tasks or {}).values() if t.status == "incomplete"]
    fields = {
        "session_id": session_id,
        "run_id": run_id,
        "agent": agent,
        "status": "done" if status == "incomplete" else status,
        "output": typed,
        "usage": await session_usage(store, session_id),
        "error": None if status in ("done", "incomplete") else error,
        "incomplete": status == "incomplete" or bool(stopped),
        "stop_reason": stop_reason or (stopped[0].stop_reason if stopped else None),
    }
    result = RunResult(**fields) if tasks is None else GraphResult(**fields, tasks=tasks)
    result._cause = cause
    return result
