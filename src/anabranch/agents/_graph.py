"""``Task`` and ``Graph``: a DAG of agent tasks, validated when it is built (pure data)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from anabranch.agents._agent import Agent
from anabranch.messages import ValidText

__all__ = ["Graph", "Task"]


class Task(BaseModel):
    """One node of a ``Graph``: ``agent`` works on ``prompt`` once ``depends_on`` are done.

    The prompt it receives is ``prompt`` followed by the final reports (not the
    transcripts) of the tasks it depends on.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    id: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_.-]+$")
    agent: Agent
    prompt: ValidText = Field(min_length=1)
    depends_on: tuple[str, ...] = ()


def _find_cycle(edges: dict[str, tuple[str, ...]], order: list[str]) -> list[str] | None:
    """One dependency cycle as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in edges.get(node, ()):
            if dep not in edges:
                continue
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in order:
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


class Graph(BaseModel):
    """A DAG of tasks run in one session by ``Runtime.run_graph``.

    Ready tasks run concurrently (at most ``max_concurrency`` at once). A failed task fails
    the tasks that depend on it and lets independent branches finish; with ``fail_fast``
    the first failure cancels everything still running or waiting.

    Raises ``pydantic.ValidationError`` naming duplicate ids, unknown dependencies and cycles.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    tasks: tuple[Task, ...] = Field(min_length=1)
    name: str = Field("graph", min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_.-]+$")
    max_concurrency: int = Field(4, gt=0)
    fail_fast: bool = False

    @model_validator(mode="after")
    def _is_a_dag(self) -> Graph:
        ids = [t.id for t in self.tasks]
        problems: list[str] = []
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            problems.append(f"duplicate task ids: {', '.join(duplicates)}")
        known = set(ids)
        unknown = [
            f"{t.id} -> {dep}" for t in self.tasks for dep in t.depends_on if dep not in known
        ]
        if unknown:
            problems.append(f"unknown dependencies: {', '.join(unknown)}")
        if not duplicates:
            cycle = _find_cycle({t.id: t.depends_on for t in self.tasks}, ids)
            if cycle:
                problems.append(f"dependency cycle: {' -> '.join(cycle)}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def task(self, task_id: str) -> Task:
        """The task with this id (``KeyError`` if there is none)."""
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise KeyError(task_id)

    def order(self) -> list[Task]:
        """Tasks in a dependency order (dependencies first; ties keep declaration order)."""
        done: set[str] = set()
        ordered: list[Task] = []
        remaining = list(self.tasks)
        while remaining:
            ready = [t for t in remaining if all(d in done for d in t.depends_on)]
            for task in ready:
                ordered.append(task)
                done.add(task.id)
            remaining = [t for t in remaining if t.id not in done]
        return ordered

    def sinks(self) -> list[Task]:
        """Tasks no other task depends on (their reports are the graph's output)."""
        needed = {d for t in self.tasks for d in t.depends_on}
        return [t for t in self.tasks if t.id not in needed]
