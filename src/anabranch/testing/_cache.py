"""Prompt-cache accounting with the Messages API's rules.

The prompt is a sequence of blocks in prefix order (tools, then system, then message content).
A cache entry is keyed by the model and a hash of the whole prefix up to a breakpoint block.
Writes happen only at breakpoints whose prefix reaches the minimum cacheable length; a read
is the longest live entry any breakpoint finds at its own position or up to ``LOOKBACK``
blocks before it. Hits refresh the entry's TTL. Token counts come from
``anabranch.context._tokens`` so ``input + cache read + cache write == count_tokens``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from anabranch.context._tokens import estimate_messages, estimate_request
from anabranch.messages import (
    CacheTTL,
    Message,
    ModelRequest,
    Usage,
    canonical_json,
)
from anabranch.testing._wire import BlockRef

__all__ = ["LOOKBACK", "TTL_SECONDS", "ManualClock", "PrefixBlock", "PromptCache", "prefix_blocks"]

LOOKBACK = 20
"""How many blocks before a breakpoint are checked for an earlier cache entry."""
TTL_SECONDS: Mapping[CacheTTL, float] = {"5m": 300.0, "1h": 3600.0}


class ManualClock:
    """A clock that only moves when told to: pass it as ``clock=`` to test cache expiry."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``."""
        self.now += seconds


@dataclass(frozen=True)
class PrefixBlock:
    """One block of the prompt in prefix order."""

    key: str
    """Hash of the whole prefix up to and including this block."""
    tokens: int
    """Tokens of the whole prefix up to and including this block."""
    ttl: CacheTTL | None
    """Set when this block carries a cache breakpoint."""


def _chain(previous: str, item: object) -> str:
    return hashlib.sha256((previous + canonical_json(item)).encode()).hexdigest()


def prefix_blocks(
    request: ModelRequest, marks: Mapping[BlockRef, CacheTTL], *, salt: str = ""
) -> list[PrefixBlock]:
    """``request`` as prefix blocks: cumulative hash and cumulative token count per block.

    ``salt`` (request options such as tool_choice) keys the messages part only, so changing
    it keeps the tools and system entries.
    """
    blocks: list[PrefixBlock] = []
    key = ""
    for i, tool in enumerate(request.tools):
        key = _chain(key, ["tool", tool.model_dump(mode="json", exclude={"cache"})])
        head = ModelRequest(model=request.model, tools=request.tools[: i + 1], messages=())
        blocks.append(PrefixBlock(key, estimate_request(head), marks.get(("tool", i, 0))))
    for i, system in enumerate(request.system):
        key = _chain(key, ["system", system.text])
        head = ModelRequest(
            model=request.model,
            tools=request.tools,
            system=request.system[: i + 1],
            messages=(),
        )
        blocks.append(PrefixBlock(key, estimate_request(head), marks.get(("system", i, 0))))
    base = estimate_request(
        ModelRequest(model=request.model, tools=request.tools, system=request.system, messages=())
    )
    for i, message in enumerate(request.messages):
        for j, block in enumerate(message.content):
            key = _chain(key, ["message", salt, i, message.role, j, block.model_dump(mode="json")])
            partial = Message(role=message.role, content=message.content[: j + 1])
            tokens = base + estimate_messages([partial])
            blocks.append(PrefixBlock(key, tokens, marks.get(("message", i, j))))
        base += estimate_messages([message])
    return blocks


@dataclass
class _Entry:
    ttl: CacheTTL
    expires_at: float


class PromptCache:
    """Cache entries of one server, keyed by (model, prefix hash)."""

    def __init__(
        self, *, min_tokens: int = 1024, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if min_tokens < 0:
            raise ValueError("min_cache_tokens must be >= 0")
        self.min_tokens = min_tokens
        self.clock = clock
        self._entries: dict[tuple[str, str], _Entry] = {}

    def __len__(self) -> int:
        now = self.clock()
        return sum(1 for e in self._entries.values() if e.expires_at > now)

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()

    def _live(self, model: str, key: str, now: float) -> _Entry | None:
        entry = self._entries.get((model, key))
        if entry is not None and entry.expires_at <= now:
            del self._entries[model, key]
            return None
        return entry

    def _hit(self, model: str, blocks: list[PrefixBlock], now: float) -> int:
        """Position of the longest live entry any breakpoint finds, or -1."""
        hit = -1
        for position, block in enumerate(blocks):
            if block.ttl is None:
                continue
            for back in range(position, max(position - LOOKBACK, 0) - 1, -1):
                if back <= hit:
                    break
                if self._live(model, blocks[back].key, now) is not None:
                    hit = back
                    break
        return hit

    def account(self, model: str, blocks: list[PrefixBlock], total_tokens: int) -> Usage:
        """Read and write the cache for one request; its input-side usage."""
        now = self.clock()
        hit = self._hit(model, blocks, now)

        def tokens(position: int | None) -> int:
            return blocks[position].tokens if position is not None and position >= 0 else 0

        read = tokens(hit)
        for position in range(hit + 1):
            entry = self._live(model, blocks[position].key, now)
            if entry is not None and (position == hit or blocks[position].ttl is not None):
                entry.expires_at = now + TTL_SECONDS[entry.ttl]
        writable = [
            p
            for p, b in enumerate(blocks)
            if b.ttl is not None and p > hit and b.tokens >= self.min_tokens
        ]
        one_hour = [p for p in writable if blocks[p].ttl == "1h"]
        last_1h = max(one_hour) if one_hour else None
        last = max(writable) if writable else None
        write_1h = tokens(last_1h) - read if last_1h is not None else 0
        write_5m = tokens(last) - max(read, tokens(last_1h)) if last is not None else 0
        for p in writable:
            ttl = blocks[p].ttl or "5m"
            self._entries[model, blocks[p].key] = _Entry(ttl, now + TTL_SECONDS[ttl])
        return Usage(
            input_tokens=total_tokens - read - write_1h - write_5m,
            cache_read_input_tokens=read,
            cache_creation_input_tokens=write_1h + write_5m,
            cache_creation_5m_input_tokens=write_5m,
            cache_creation_1h_input_tokens=write_1h,
        )
