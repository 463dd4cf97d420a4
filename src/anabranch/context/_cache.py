"""Prompt caching: where the breakpoints go, and why a call read less cache than it could.

Pure logic. Facts it relies on (Messages API): at most 4 breakpoints per request; prefix
order is tools, then system, then messages; a breakpoint looks back at most 20 content
blocks for an earlier entry; 1h entries must come before 5m entries.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from anabranch._memo import IdentityMemo
from anabranch.messages import (
    CacheTTL,
    Message,
    ModelRequest,
    RawBlock,
    RedactedThinkingBlock,
    SystemBlock,
    TextBlock,
    ThinkingBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
    canonical_json,
)

__all__ = [
    "LOOKBACK_BLOCKS",
    "MAX_BREAKPOINTS",
    "TTL_SECONDS",
    "breakpoints",
    "CacheBreakCause",
    "CallCacheState",
    "cache_read_ratio",
    "classify_cache_break",
    "expected_cache_read",
    "message_ttl",
    "place_breakpoints",
    "system_digest",
    "tools_digest",
]

MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20
TTL_SECONDS: dict[CacheTTL, float] = {"5m": 300.0, "1h": 3600.0}

CacheBreakCause = Literal[
    "model_changed",
    "tools_changed",
    "thinking_changed",
    "tool_choice_changed",
    "compaction",
    "system_changed",
    "messages_changed",
    "ttl_expired",
    "unknown",
]


def _cacheable(message: Message) -> bool:
    """Whether the last block of ``message`` can carry a breakpoint (not an empty text, not
    a thinking block: the API caches those only as part of a later block's prefix)."""
    if not message.content:
        return False
    last = message.content[-1]
    if type(last) is ToolResultBlock or type(last) is ToolUseBlock:
        return True  # (the usual last block, told apart with no call)
    if isinstance(last, ThinkingBlock | RedactedThinkingBlock | RawBlock):
        return False
    return not (isinstance(last, TextBlock) and not last.text)


def _lookback_anchor(messages: Sequence[Message]) -> int | None:
    """Where the previous call's rolling breakpoint was, if the last one cannot see it.

    The previous request ended just before the last assistant message; if more than
    ``LOOKBACK_BLOCKS`` blocks follow that point, the rolling breakpoint alone would miss
    the entry the previous call wrote, so a breakpoint goes back on it. Looks at the
    messages after that point only (usually two), however long the context is.
    """
    count = len(messages)
    last_assistant = count - 1
    while last_assistant > 0 and messages[last_assistant].role != "assistant":
        last_assistant -= 1
    if last_assistant <= 0:
        return None
    anchor = last_assistant - 1
    distance = 0
    for index in range(last_assistant, count):
        distance += len(messages[index].content)
    if distance < LOOKBACK_BLOCKS or not _cacheable(messages[anchor]):
        return None
    return anchor


def message_ttl(ttl: CacheTTL, prefix_ttl: CacheTTL | None = None) -> CacheTTL:
    """The TTL message breakpoints are sent with: never 1h after a 5m prefix."""
    return "5m" if (prefix_ttl or ttl) == "5m" else ttl


def place_breakpoints(
    request: ModelRequest,
    *,
    ttl: CacheTTL | None,
    prefix_ttl: CacheTTL | None = None,
) -> ModelRequest:
    """``request`` with its cache breakpoints placed deterministically (never more than 4).

    Every existing mark is replaced. In priority order: the last message block (rolling),
    the end of the first (static) system block, the end of the last (dynamic) system block,
    the previous call's message breakpoint when a long tool turn puts it beyond the 20-block
    lookback, and the end of the tool list (the system breakpoint after it already caches
    the tools). ``prefix_ttl`` (default ``ttl``) applies to tools and system; a 1h message
    breakpoint after a 5m prefix is sent as 5m, since 1h entries must come first.
    ``ttl=None`` removes every breakpoint. The very same request when it is placed already.
    """
    tools, system, marks = breakpoints(
        request.tools, request.system, request.messages, ttl=ttl, prefix_ttl=prefix_ttl
    )
    if tools is request.tools and system is request.system and marks == request.message_breakpoints:
        return request
    return request.model_copy(
        update={"tools": tools, "system": system, "message_breakpoints": marks}
    )


def breakpoints(
    tools: tuple[ToolDefinition, ...],
    system: tuple[SystemBlock, ...],
    messages: Sequence[Message],
    *,
    ttl: CacheTTL | None,
    prefix_ttl: CacheTTL | None = None,
) -> tuple[tuple[ToolDefinition, ...], tuple[SystemBlock, ...], tuple[tuple[int, CacheTTL], ...]]:
    """What ``place_breakpoints`` places, for a request still to be built: the tools and
    system blocks marked (the same tuples when they already are) and the message marks."""
    if ttl is None:
        return _marked(tools, (), None), _marked(system, (), None), ()
    # in priority order: the rolling one, the first and the last system block, the
    # lookback anchor, the tool list; the first four of them (so only the tools can miss)
    rolling = len(messages) - 1 if messages and _cacheable(messages[-1]) else None
    anchor = _lookback_anchor(messages)
    last_system = len(system) - 1
    taken = (rolling is not None) + min(len(system), 2) + (anchor is not None)
    head_ttl = prefix_ttl or ttl
    tool_at = (len(tools) - 1,) if tools and taken < MAX_BREAKPOINTS else ()
    new_tools = _marked(tools, tool_at, head_ttl)
    new_system = _marked(system, (0, last_system), head_ttl)
    messages_ttl = message_ttl(ttl, prefix_ttl)  # (the rule the cache watch expects too)
    marks: tuple[tuple[int, CacheTTL], ...]
    if anchor is None:  # the anchor always comes before the rolling one
        marks = () if rolling is None else ((rolling, messages_ttl),)
    elif rolling is None:
        marks = ((anchor, messages_ttl),)
    else:
        marks = ((anchor, messages_ttl), (rolling, messages_ttl))
    return new_tools, new_system, marks


_Marked = TypeVar("_Marked", ToolDefinition, SystemBlock)


def _marked(
    items: tuple[_Marked, ...], at: tuple[int, ...], ttl: CacheTTL | None
) -> tuple[_Marked, ...]:
    """``items`` with a ``ttl`` mark at the indexes ``at`` and none elsewhere: the very same
    tuple when it already is so (a run's snapshot usually is), so what is derived from it
    by identity (its digests, the request fingerprint's prefix) is reused."""
    changed: list[_Marked] | None = None
    for index, item in enumerate(items):
        mark = ttl if index in at else None
        if item.cache != mark:
            if changed is None:
                changed = list(items)
            changed[index] = item.model_copy(update={"cache": mark})
    return items if changed is None else tuple(changed)


def _digest(payload: object) -> str:
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


_SYSTEM_DIGESTS: IdentityMemo[str] = IdentityMemo()
_TOOLS_DIGESTS: IdentityMemo[str] = IdentityMemo()
"""Digests by the (immutable) blocks they were computed from: a run keeps its snapshot's
blocks from call to call."""


def system_digest(system: Sequence[SystemBlock]) -> str:
    """A hash of what the cache keys on in the system blocks (breakpoint marks excluded)."""
    return _SYSTEM_DIGESTS.get((system,), _system_digest)


def tools_digest(tools: Sequence[ToolDefinition]) -> str:
    """A hash of what the cache keys on in the tool list (breakpoint marks excluded)."""
    return _TOOLS_DIGESTS.get((tools,), _tools_digest)


def _system_digest(system: Sequence[SystemBlock]) -> str:
    return _digest([b.text for b in system])


def _tools_digest(tools: Sequence[ToolDefinition]) -> str:
    return _digest([[t.name, t.description, t.input_schema] for t in tools])


def expected_cache_read(previous: Usage) -> int:
    """What the next call of the same run can read: everything ``previous`` read or wrote."""
    return previous.cache_read_input_tokens + previous.cache_creation_input_tokens


def cache_read_ratio(usage: Usage) -> float:
    """Share of the prompt that was read from cache (0.0 for an empty prompt)."""
    total = usage.total_input_tokens
    return usage.cache_read_input_tokens / total if total else 0.0


@dataclass(frozen=True)
class CallCacheState:
    """What decides whether a call can read the cache the previous call left."""

    model: str
    system_digest: str
    tools_digest: str
    compactions: int
    started: float
    """When the request was committed (seconds since the epoch)."""
    usage: Usage
    settings: str = ""
    """``ModelSettings.cache_key()`` of the request: thinking and tool choice key the
    messages part of the cache (``""``: not recorded)."""


def _settings_cause(previous: str, current: str) -> CacheBreakCause | None:
    """Which cache-keying setting changed between two calls, if one did."""
    if not previous or not current or previous == current:
        return None
    before, after = json.loads(previous), json.loads(current)
    return "thinking_changed" if before[0] != after[0] else "tool_choice_changed"


def classify_cache_break(
    previous: CallCacheState, current: CallCacheState, *, ttl: CacheTTL
) -> CacheBreakCause | None:
    """The cause when ``current`` read less cache than ``previous`` left, else ``None``.

    Causes are checked from the widest invalidation down: model, tools, thinking or tool
    choice settings, compaction, system, then idle time beyond ``ttl`` (of the rolling
    breakpoint) since ``previous``.
    """
    if current.usage.cache_read_input_tokens >= expected_cache_read(previous.usage):
        return None
    if previous.model != current.model:
        return "model_changed"
    if previous.tools_digest != current.tools_digest:
        return "tools_changed"
    settings = _settings_cause(previous.settings, current.settings)
    if settings is not None:
        return settings
    if current.compactions != previous.compactions:
        return "compaction"
    if previous.system_digest != current.system_digest:
        return "system_changed"
    if current.started - previous.started > TTL_SECONDS[ttl]:
        return "ttl_expired"
    return "unknown"
