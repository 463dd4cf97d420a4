"""What a finished run hands back."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from anabranch.messages import Usage

__all__ = ["GraphResult", "RunResult", "TaskResult", "TaskStatus"]


class RunResult(BaseModel):
    """The outcome of ``Runtime.run`` / ``Runtime.resume``."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    run_id: str
    agent: str
    status: Literal["done", "failed"]
    output: str
    usage: Usage
    """Token usage of the whole session (every agent run in it)."""
    error: str | None = None


TaskStatus = Literal["done", "failed", "cancelled"]


class TaskResult(BaseModel):
    """How one task of a graph ended."""

    model_config = ConfigDict(frozen=True)

    id: str
    agent: str
    status: TaskStatus
    """``failed`` also covers a task that never ran because a dependency failed
    (``run_id`` is then None); ``cancelled``: stopped by ``fail_fast``."""
    report: str = ""
    """The task's final answer (in full; dependents receive it capped)."""
    run_id: str | None = None
    error: str | None = None


class GraphResult(RunResult):
    """The outcome of ``Runtime.run_graph`` (also returned by ``resume`` for a graph).

    ``output`` is the report of the graph's final task (or the reports of all tasks
    nothing depends on, each under its id); ``run_id`` is empty (a graph has no root run).
    """

    tasks: dict[str, TaskResult]

    @property
    def failed(self) -> list[str]:
        """Ids of the tasks that did not finish."""
        return [t.id for t in self.tasks.values() if t.status != "done"]
