"""Live events of a session: typed, one pydantic model per kind.

Every event carries ``kind``, ``session_id``, ``run_id`` (the run it happened in; ``None``
for session-level events), ``agent``, ``parent_run_id`` (set for sub-agents) and ``time``.
Sub-agents' events come through the same stream as their parent's.

Get them with ``async with rt.stream(agent, task) as events: async for event in events``
or ``Runtime(on_event=callback)``. A slow consumer never slows the run: text and thinking
deltas waiting for it are merged into one; every other event is kept.

The JSON form (``event.model_dump_json()``, one line per event in ``anabranch run --events``)
is stable: fields are only ever added, never renamed or removed.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from anabranch.messages import Usage

__all__ = [
    "DELTA_KINDS",
    "EVENT_ADAPTER",
    "AnyEvent",
    "ApprovalRequested",
    "CacheBreakEvent",
    "ChildReported",
    "ChildSpawned",
    "CompactionFinished",
    "CompactionStarted",
    "Event",
    "LimitReached",
    "LimitWarning",
    "ModelCallFinished",
    "ModelCallStarted",
    "Retry",
    "RunFinished",
    "RunStarted",
    "SessionFinished",
    "SessionStarted",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallFinished",
    "ToolCallStarted",
]


class Event(BaseModel):
    """What every event has."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str
    session_id: str
    run_id: str | None = None
    agent: str | None = None
    parent_run_id: str | None = None
    time: float
    """Unix time the event happened."""


class SessionStarted(Event):
    """A session is being driven (a new one, a resume, or a conversation's next turn)."""

    kind: Literal["session_started"] = "session_started"
    task: str
    """The session's first task, or the message of this turn."""
    resumed: bool = False


class SessionFinished(Event):
    kind: Literal["session_finished"] = "session_finished"
    status: Literal["done", "failed", "cancelled", "waiting"]
    """``waiting``: paused on a tool approval (answer it, then resume)."""
    output: str = ""
    error: str | None = None
    usage: Usage = Usage()
    incomplete: bool = False
    """A limit stopped the session's root run: ``output`` is its report so far."""
    stop_reason: str | None = None


class RunStarted(Event):
    """An agent run starts being driven (fresh or resumed)."""

    kind: Literal["run_started"] = "run_started"
    depth: int = 0
    mode: str = "root"
    turns: int = 0
    """Turns already done (non-zero when a stored run is continued)."""
    window: int
    threshold: int


class RunFinished(Event):
    kind: Literal["run_finished"] = "run_finished"
    status: Literal["done", "failed", "cancelled", "stopped", "waiting"]
    """``stopped``: unfinished and resumable (e.g. the model kept failing);
    ``waiting``: paused on a tool approval."""
    output: str = ""
    error: str | None = None
    turns: int = 0
    stop_reason: str | None = None
    """Set when a limit ended the run with a report (``max_turns``, ``timeout``, ``budget``):
    ``status`` is ``done`` and ``output`` is that (incomplete) report."""


class ModelCallStarted(Event):
    kind: Literal["model_call_started"] = "model_call_started"
    turn: int
    attempt: int
    purpose: str | None = None
    """``None`` for the agent's own turn; ``compaction`` for a summarizer call."""
    context_tokens: int
    """Estimated tokens of the context about to be sent."""
    window: int
    threshold: int


class ModelCallFinished(Event):
    kind: Literal["model_call_finished"] = "model_call_finished"
    turn: int
    attempt: int
    purpose: str | None = None
    ok: bool = True
    usage: Usage = Usage()
    stop_reason: str | None = None
    cost: float | None = None
    """Estimated USD of this call (``None``: the model is not in the price table)."""
    error: str | None = None


class TextDelta(Event):
    kind: Literal["text_delta"] = "text_delta"
    text: str


class ThinkingDelta(Event):
    kind: Literal["thinking_delta"] = "thinking_delta"
    text: str


class ToolCallStarted(Event):
    kind: Literal["tool_call_started"] = "tool_call_started"
    call_id: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCallFinished(Event):
    kind: Literal["tool_call_finished"] = "tool_call_finished"
    call_id: str
    tool: str
    is_error: bool = False
    chars: int = 0
    """Length of the result as the tool returned it."""


class ChildSpawned(Event):
    """Emitted by the parent run; ``child_run_id``'s own events follow."""

    kind: Literal["child_spawned"] = "child_spawned"
    child_run_id: str
    child_agent: str
    call_id: str
    mode: str = "fresh"


class ChildReported(Event):
    kind: Literal["child_reported"] = "child_reported"
    child_run_id: str
    child_agent: str
    call_id: str
    status: Literal["done", "failed"]
    chars: int = 0
    error: str | None = None
    stop_reason: str | None = None
    """Set when a limit stopped the child: ``status`` is ``done`` and its report says it is
    incomplete (``max_turns``, ``timeout``, ``budget``)."""


class CompactionStarted(Event):
    kind: Literal["compaction_started"] = "compaction_started"
    tokens_before: int
    messages_before: int


class CompactionFinished(Event):
    kind: Literal["compaction_finished"] = "compaction_finished"
    boundary_id: int | None = None
    boundary_kind: str = "compaction"
    """``compaction`` or ``clear`` (old tool results stubbed)."""
    strategy: str | None = None
    trigger: str | None = None
    status: str = "ok"
    tokens_before: int | None = None
    tokens_after: int | None = None
    messages_before: int | None = None
    messages_after: int | None = None
    error: str | None = None


class CacheBreakEvent(Event):
    kind: Literal["cache_break"] = "cache_break"
    cause: str
    expected_read: int
    actual_read: int


class Retry(Event):
    kind: Literal["retry"] = "retry"
    attempt: int
    """The attempt that failed (the next one is ``attempt + 1``)."""
    error: str
    error_type: str
    delay: float


class ApprovalRequested(Event):
    """A tool call waits for ``rt.approve`` / ``anabranch approve`` (committed first)."""

    kind: Literal["approval_requested"] = "approval_requested"
    call_id: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class LimitWarning(Event):
    """A budget passed its soft share; the agent is told in its next user turn."""

    kind: Literal["limit_warning"] = "limit_warning"
    scope: str
    """``session``, ``tenant <name>`` or ``agent <name>``."""
    spent_share: float
    remaining_tokens: int | None = None
    remaining_usd: float | None = None


class LimitReached(Event):
    """A limit stopped the run: its final report (a call without tools) follows."""

    kind: Literal["limit_reached"] = "limit_reached"
    reason: Literal["max_turns", "timeout", "budget"]
    detail: str
    scope: str = ""
    remaining_tokens: int | None = None
    remaining_usd: float | None = None


AnyEvent = Annotated[
    SessionStarted
    | SessionFinished
    | RunStarted
    | RunFinished
    | ModelCallStarted
    | ModelCallFinished
    | TextDelta
    | ThinkingDelta
    | ToolCallStarted
    | ToolCallFinished
    | ChildSpawned
    | ChildReported
    | CompactionStarted
    | CompactionFinished
    | CacheBreakEvent
    | Retry
    | ApprovalRequested
    | LimitWarning
    | LimitReached,
    Field(discriminator="kind"),
]
"""Any event, discriminated by ``kind``."""

EVENT_ADAPTER: TypeAdapter[AnyEvent] = TypeAdapter(AnyEvent)
"""Parses one event from its JSON (``EVENT_ADAPTER.validate_json(line)``)."""

DELTA_KINDS = frozenset({"text_delta", "thinking_delta"})
"""Kinds a slow consumer may receive merged; every other kind is delivered one by one."""
