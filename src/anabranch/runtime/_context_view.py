"""The context pipeline's seam: a read-only ``ContextView`` in, a ``ContextChange`` out.

A pipeline (compaction, clearing, the breaker's fallback) never touches the run. It reads
the run through ``ContextView`` (identity, policy, prompt snapshot, context, counters, a
store it may read, and a summarizer it may call) and returns what it decided as a value:
the boundaries to persist, each with the derived rows and spills that belong to it and the
context it leaves behind. The loop (``AgentRun.pipeline_step``) is the one place that
commits a change and swaps the run's context in, in order, before the next model call
(write-ahead: a boundary is durable before any request is built from its context).

The only writes a pipeline makes itself are of its own knowledge, not of run state: the
context limits a channel taught (``ContextStore.save_context_limit``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from anyio.abc import TaskGroup

from anabranch.agents import Agent
from anabranch.context._digest import Manifest
from anabranch.messages import Message, ModelRequest, ModelResponse, SystemBlock, ToolDefinition
from anabranch.runtime._builtins import ToolOutcome
from anabranch.store import BoundaryRecord, ContextLimitRecord, MessageRecord, SpillRecord
from anabranch.traces import Tracing

__all__ = [
    "BoundaryCommit",
    "CompactionOutcome",
    "ContextChange",
    "ContextStore",
    "ContextView",
    "Ingested",
    "SpillWrite",
]


class ContextStore(Protocol):
    """What a pipeline may do with the store: read boundaries and spills; keep limits."""

    async def latest_boundary(self, run_id: str) -> BoundaryRecord | None: ...

    async def list_boundaries(
        self, *, run_id: str | None = None, session_id: str | None = None
    ) -> list[BoundaryRecord]: ...

    async def get_spill_record(self, handle: str) -> SpillRecord | None: ...

    async def context_limit(self, model: str, channel: str) -> ContextLimitRecord | None: ...

    async def save_context_limit(self, limit: ContextLimitRecord) -> None: ...


class ContextView(Protocol):
    """What a pipeline may read of a run (every member read-only; the loop implements it)."""

    @property
    def id(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def agent(self) -> Agent:
        """The definition: its ``context`` policy, model, ``max_tokens``, tools."""
        ...

    @property
    def system(self) -> tuple[SystemBlock, ...]: ...
    @property
    def tools(self) -> tuple[ToolDefinition, ...]: ...
    @property
    def context(self) -> Sequence[Message]: ...
    @property
    def next_seq(self) -> int:
        """The seq the next committed message (or derived row) gets."""
        ...

    @property
    def compactions(self) -> int: ...

    @property
    def thinking_floor(self) -> int:
        """Leading context messages whose thinking requests leave out (``_thinking_view``)."""
        ...
    @property
    def context_tokens(self) -> int:
        """The context's size as the next request would count it (anchored on usage)."""
        ...

    @property
    def threshold(self) -> int: ...
    @property
    def channel(self) -> str | None:
        """The channel the run's model calls go through (a base URL, a cloud), if known."""
        ...

    @property
    def configured_window(self) -> int | None:
        """A window the model client was told its channel enforces (``context_window=``)."""
        ...

    @property
    def served_model(self) -> str | None:
        """The model that served the latest response (another one after a model switch)."""
        ...

    @property
    def background(self) -> TaskGroup | None:
        """A task group held while the run is driven, for work a pipeline starts ahead
        (it commits nothing there: it returns what it found in a later change)."""
        ...

    @property
    def store(self) -> ContextStore: ...
    @property
    def tracing(self) -> Tracing: ...

    def estimate_tokens(self, context: Sequence[Message]) -> int:
        """Estimated tokens of the request the run would send with ``context``."""
        ...

    def clearable(self, tool_name: str) -> bool:
        """Whether old results of ``tool_name`` may be cleared (``@tool(clearable=...)``)."""
        ...

    async def call_summarizer(
        self, request: ModelRequest, *, purpose: str = "compaction"
    ) -> ModelResponse:
        """One summarizer request: retried like any model call, traced as a child span."""
        ...


@dataclass(frozen=True)
class SpillWrite:
    """A full output that leaves the context, kept in the store under its recall handle."""

    handle: str
    call_id: str
    content: str


@dataclass(frozen=True)
class BoundaryCommit:
    """One boundary row to persist, with what belongs to it.

    ``context`` is ``None`` for a record only (a failed attempt, the breaker opening):
    the context stays as it is.
    """

    boundary: BoundaryRecord
    rows: tuple[MessageRecord, ...] = ()
    """Derived messages (e.g. a summary) appended to the log with the boundary."""
    spills: tuple[SpillWrite, ...] = ()
    """Saved before the boundary, so every handle it names is recallable once it exists."""
    context: tuple[Message, ...] | None = None
    next_seq: int | None = None
    """The run's next seq once ``rows`` are appended (with ``context``)."""
    manifest: Manifest | None = None
    """What the boundary removed (also in its ``extra``), for callers and spans."""


@dataclass(frozen=True)
class ContextChange:
    """What one pipeline step decided, for the loop to commit in order."""

    commits: tuple[BoundaryCommit, ...] = ()
    rebuild_prompt: bool = False
    """A compaction applied: the prompt snapshot is rebuilt after the commits."""
    failure: str | None = None
    """Why the last attempt did not apply (informational)."""
    fail_run: str | None = None
    """The run must fail with ``CompactionFailedError`` (after the commits)."""

    @property
    def applied(self) -> bool:
        """Whether the context changed."""
        return any(commit.context is not None for commit in self.commits)

    def then(self, other: ContextChange) -> ContextChange:
        """This change followed by ``other``."""
        return ContextChange(
            commits=self.commits + other.commits,
            rebuild_prompt=self.rebuild_prompt or other.rebuild_prompt,
            failure=other.failure,
            fail_run=self.fail_run or other.fail_run,
        )


@dataclass(frozen=True)
class Ingested:
    """The version of a tool result that enters the context, and spills to keep with it."""

    outcome: ToolOutcome
    spills: tuple[SpillWrite, ...] = field(default=())


@dataclass(frozen=True)
class CompactionOutcome:
    """What one compaction step did, once the loop committed it."""

    applied: bool
    boundary_id: int | None = None
    failure: str | None = None
