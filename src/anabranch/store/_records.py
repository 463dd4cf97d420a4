"""Plain records the store reads and writes. Content is opaque JSON text to the store."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal, TypeVar

__all__ = [
    "BoundaryRecord",
    "CallRecord",
    "CallUsageSum",
    "ContextLimitRecord",
    "HistoryHit",
    "MessageRecord",
    "RunRecord",
    "RunStatus",
    "SessionBudgetRecord",
    "SessionRecord",
    "SnapshotRecord",
    "SpendRecord",
    "SpendTotal",
    "SpillRecord",
    "ToolEvent",
    "ToolEventRecord",
]

RunStatus = Literal["running", "done", "incomplete", "failed", "cancelled", "waiting"]
"""``waiting`` (sessions only): paused until a pending tool approval is answered;
``incomplete``: a limit stopped the run and it ended with a report of what it found."""
ToolEvent = Literal["started", "finished", "approval_requested", "approval_decided"]

_R = TypeVar("_R")


def _direct_init(cls: type[_R]) -> type[_R]:
    """A frozen dataclass whose ``__init__`` fills the instance's ``__dict__`` in one step.

    The generated ``__init__`` of a frozen dataclass sets each field through
    ``object.__setattr__`` (its only way past the class's own ``__setattr__``): a call's
    record has 19 fields, and a call, its messages and its tool events are recorded on
    every model call. This ``__init__`` has the same parameters and defaults and leaves
    the same ``__dict__`` (the fields, in order), so the records compare, hash, copy and
    pickle as before (``tests/test_records_init.py``)."""
    params, items, defaults = [], [], {}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.default_factory is not MISSING or not f.init:
            raise TypeError(f"{cls.__name__}.{f.name}: only plain fields and defaults")
        if f.default is MISSING:
            params.append(f.name)
        else:
            defaults[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        items.append(f"{f.name!r}: {f.name}")
    source = (
        f"def __init__(self, {', '.join(params)}):\n"
        f"    self.__dict__.update({{{', '.join(items)}}})\n"
    )
    namespace: dict[str, Any] = {}
    exec(source, defaults, namespace)  # as dataclasses builds its own
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    setattr(cls, "__init__", init)  # noqa: B010 - mypy: no assignment to a method
    return cls


@dataclass(frozen=True)
class SessionRecord:
    id: str
    created: float
    kind: Literal["agent", "graph"]
    entry: str
    """Name of the root agent (or graph)."""
    task: str
    status: RunStatus = "running"
    output: str | None = None
    error: str | None = None
    finished: float | None = None
    source: str | None = None
    """Where the definition came from (``file.py:obj``), so the CLI can resume it."""
    definition: str | None = None
    """JSON of the definition's structure, for ``show``."""


@dataclass(frozen=True)
class RunRecord:
    id: str
    session_id: str
    agent_name: str
    model: str
    created: float
    parent_run_id: str | None = None
    parent_call_id: str | None = None
    task_id: str | None = None
    depth: int = 0
    mode: str = "root"
    status: RunStatus = "running"
    output: str | None = None
    error: str | None = None
    finished: float | None = None


@_direct_init
@dataclass(frozen=True)
class MessageRecord:
    run_id: str
    seq: int
    role: Literal["user", "assistant"]
    content: str
    """JSON list of content blocks."""
    kind: str = "message"
    """``message`` for the transcript; ``context`` for a derived message (a stub or an
    elided copy) that a compacted context refers to by seq."""
    created: float = 0.0
    id: int | None = None


@_direct_init
@dataclass(frozen=True)
class CallRecord:
    """One model call attempt, written before the request leaves the process."""

    run_id: str
    turn: int
    attempt: int
    fingerprint: str
    message_count: int
    created: float
    id: int | None = None
    status: str | None = None
    """``None`` while in flight; then ``ok``, ``error``, or ``interrupted`` (the process
    stopped before the response was committed; the request was sent again on resume)."""
    error_type: str | None = None
    error: str | None = None
    response_id: str | None = None
    model: str | None = None
    stop_reason: str | None = None
    usage: str | None = None
    """JSON usage object."""
    message_seq: int | None = None
    finished: float | None = None
    snapshot_version: int | None = None
    """The prompt snapshot (system + tools) the request was built from."""
    compactions: int | None = None
    """Compactions of the run before this request."""
    settings: str | None = None
    """What of the request's model settings keys the prompt cache (thinking, tool choice),
    so a change of them is a named cache-break cause."""


@_direct_init
@dataclass(frozen=True)
class ToolEventRecord:
    run_id: str
    call_id: str
    name: str
    event: ToolEvent
    created: float
    content: str | None = None
    is_error: bool = False
    id: int | None = None
    attachments: str | None = None
    """JSON list of the images and documents a finished call returned (``None``: none)."""


@dataclass(frozen=True)
class SnapshotRecord:
    run_id: str
    version: int
    system: str
    """JSON list of system blocks."""
    tools: str
    """JSON list of tool definitions."""
    created: float
    reason: str = "start"
    id: int | None = None


@dataclass(frozen=True)
class BoundaryRecord:
    """A compaction (or rewind): how the run's context is rebuilt from here on."""

    run_id: str
    kind: str
    """``compaction`` or ``rewind``."""
    prefix: str
    """JSON list of messages that open the context (e.g. the summary)."""
    ranges: str
    """JSON list of ``[first_seq, last_seq_or_null]`` original message ranges that follow."""
    created: float
    strategy: str | None = None
    trigger: str | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    messages_before: int | None = None
    messages_after: int | None = None
    summary: str | None = None
    model: str | None = None
    duration: float | None = None
    status: str = "ok"
    error: str | None = None
    extra: str | None = None
    id: int | None = None
    details: dict[str, object] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class SpillRecord:
    """A full text kept out of a context, fetched back by its handle."""

    handle: str
    run_id: str
    call_id: str
    content: str
    created: float


@dataclass(frozen=True)
class HistoryHit:
    """One full-text search match in a run's history."""

    source: Literal["message", "spill"]
    ref: str
    """The message seq (as text) or the spill handle."""
    snippet: str


@dataclass(frozen=True)
class ContextLimitRecord:
    """A context limit one channel enforces for one model, learned or configured.

    Rows without ``run_id`` are what a channel taught (kept per ``(model, channel)`` for
    later runs and sessions); rows with one say which limit a run started with or learned.
    """

    model: str
    channel: str
    """Where calls went: a base URL without credentials, or a cloud (``bedrock:us-east-1``)."""
    maximum: int
    """The limit as the channel stated it, in its own tokens."""
    ratio: float
    """The channel's token count over anabranch's estimate of the same prompt."""
    window: int
    """The limit in anabranch's estimate (``maximum / ratio``)."""
    source: Literal["learned", "configured"]
    created: float
    run_id: str | None = None


@dataclass(frozen=True)
class SpendRecord:
    """Tokens and estimated dollars one model call spent for a tenant."""

    tenant: str
    session_id: str
    run_id: str
    tokens: int
    cost_usd: float
    created: float


@dataclass(frozen=True)
class CallUsageSum:
    """The usage of one run's successful calls to one model, summed per usage key."""

    run_id: str
    model: str | None
    sums: dict[str, int]
    """Usage key (``input_tokens``, ...) to its sum over the calls (0 where absent)."""


@dataclass(frozen=True)
class SpendTotal:
    """A tenant's spend summed over a period."""

    tokens: int = 0
    cost_usd: float = 0.0


@dataclass(frozen=True)
class SessionBudgetRecord:
    """The budget a session runs under, and the tenant it spends for (latest row wins:
    a session continued with a new budget gets a new row)."""

    session_id: str
    created: float
    tenant: str | None = None
    budget: str | None = None
    """JSON of the session's ``Budget``; None: no session budget."""
    tenant_budget: str | None = None
    """JSON of the tenant's ``Budget`` when the session started (for ``show``)."""
