"""Rate limits on model calls: requests and tokens per period, shared by every caller.

``RateLimitedModel(model, limiter)`` is a ``Model`` that asks ``limiter`` for a slot
before each call and, after it, tells the limiter what the call really used. A 429 with
``retry-after`` pauses the limiter for that long, so every caller sharing it waits, not
only the one that was refused (the retry policy then retries the call as before).

The limit is a sliding window: over any ``period`` seconds, at most ``requests`` calls
start and at most ``tokens`` tokens are charged. A call is charged its estimated prompt
before it starts (the window cannot know its answer yet) and its real usage once it ends:
uncached input, cache writes and output (cache reads are not counted, as the API's input
limit does not count them). A call whose estimate alone exceeds ``tokens`` waits for an
empty window, then runs.

Limiters: ``LocalCallLimiter`` (one process), ``PostgresCallLimiter`` (every process on one
PostgreSQL: ``anabranch worker --rpm/--tpm``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import anyio
from pydantic import BaseModel, ConfigDict, Field, model_validator

from anabranch.context._tokens import estimate_request
from anabranch.errors import RateLimitedError
from anabranch.messages import ModelRequest, ModelResponse, Usage
from anabranch.models._base import DeltaSink, Model, StreamingModel

__all__ = [
    "CallLimiter",
    "CallRate",
    "LocalCallLimiter",
    "RateLimitedModel",
    "admission_wait",
    "charged_tokens",
]

MARGIN = 0.002
"""Seconds added to a computed wait, so the slot it waits for has surely left the window."""


class CallRate(BaseModel):
    """At most ``requests`` calls and ``tokens`` tokens per ``period`` seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests: int | None = Field(None, ge=1)
    tokens: int | None = Field(None, ge=1)
    period: float = Field(60.0, gt=0, le=86_400)
    name: str = Field("default", min_length=1, max_length=200)
    """Which limit: callers sharing a name share it (one per API key or organisation)."""

    @model_validator(mode="after")
    def _some_limit(self) -> CallRate:
        if self.requests is None and self.tokens is None:
            raise ValueError("a call rate needs requests or tokens per period (or both)")
        return self


@runtime_checkable
class CallLimiter(Protocol):
    """Grants model calls under a ``CallRate``."""

    rate: CallRate

    async def acquire(self, tokens: int) -> int:
        """Wait for room for one call of ``tokens`` estimated tokens; returns its ticket."""
        ...

    async def settle(self, ticket: int, tokens: int) -> None:
        """The call of ``ticket`` used ``tokens`` in all (replaces its estimate)."""
        ...

    async def pause(self, seconds: float) -> None:
        """Grant nothing for ``seconds`` (the API said ``retry-after``)."""
        ...


def admission_wait(
    now: float,
    window: Sequence[tuple[float, int]],
    rate: CallRate,
    blocked_until: float,
    tokens: int,
) -> float:
    """Seconds until a call of ``tokens`` fits (0: now). ``window``: the calls granted so
    far, ``(granted at, tokens charged)``, oldest first; ``blocked_until``: a pause."""
    live = [slot for slot in window if slot[0] > now - rate.period]
    waits = [blocked_until - now]
    if rate.requests is not None and len(live) >= rate.requests:
        # the (len - limit + 1) oldest must leave the window first
        waits.append(live[len(live) - rate.requests][0] + rate.period - now)
    if rate.tokens is not None and live:
        excess = sum(charged for _, charged in live) + tokens - rate.tokens
        if excess > 0:
            # the oldest grants whose tokens cover the excess must leave the window first
            freed, last = 0, len(live) - 1
            for index, (_, charged) in enumerate(live):
                freed += charged
                if freed >= excess:
                    last = index
                    break
            waits.append(live[last][0] + rate.period - now)
    wait = max(waits)
    return wait + MARGIN if wait > 0 else 0.0


def charged_tokens(usage: Usage) -> int:
    """What a finished call counts against a token limit."""
    return usage.input_tokens + usage.cache_creation_input_tokens + usage.output_tokens


@dataclass
class _Slot:
    granted: float
    tokens: int
    ticket: int


class LocalCallLimiter:
    """A ``CallLimiter`` for the callers of one process (monotonic clock, no I/O)."""

    def __init__(self, rate: CallRate, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self._clock = clock
        self._slots: deque[_Slot] = deque()
        self._blocked_until = 0.0
        self._next_ticket = 0
        self._turn = anyio.Lock()  # first come, first served

    async def acquire(self, tokens: int) -> int:
        async with self._turn:
            while True:
                now = self._clock()
                while self._slots and self._slots[0].granted <= now - self.rate.period:
                    self._slots.popleft()
                window = [(slot.granted, slot.tokens) for slot in self._slots]
                wait = admission_wait(now, window, self.rate, self._blocked_until, tokens)
                if wait <= 0:
                    self._next_ticket += 1
                    self._slots.append(_Slot(now, tokens, self._next_ticket))
                    return self._next_ticket
                await anyio.sleep(wait)

    async def settle(self, ticket: int, tokens: int) -> None:
        for slot in self._slots:
            if slot.ticket == ticket:
                slot.tokens = tokens
                return

    async def pause(self, seconds: float) -> None:
        self._blocked_until = max(self._blocked_until, self._clock() + max(seconds, 0.0))


class RateLimitedModel:
    """A ``Model`` whose calls ``limiter`` grants (see the module docstring)."""

    def __init__(self, model: Model, limiter: CallLimiter) -> None:
        if not isinstance(model, Model):
            raise TypeError(f"RateLimitedModel needs a Model, got {type(model).__name__}")
        self.model = model
        self.limiter = limiter

    @property
    def channel(self) -> Any:
        return getattr(self.model, "channel", None)

    @property
    def context_window(self) -> Any:
        return getattr(self.model, "context_window", None)

    async def request(self, request: ModelRequest) -> ModelResponse:
        return await self._limited(request, lambda: self.model.request(request))

    async def request_streaming(self, request: ModelRequest, on_delta: DeltaSink) -> ModelResponse:
        inner = self.model
        if isinstance(inner, StreamingModel):
            return await self._limited(request, lambda: inner.request_streaming(request, on_delta))
        return await self.request(request)

    async def _limited(
        self, request: ModelRequest, call: Callable[[], Awaitable[ModelResponse]]
    ) -> ModelResponse:
        ticket = await self.limiter.acquire(estimate_request(request))
        try:
            response = await call()
        except RateLimitedError as error:
            if error.retry_after is not None:
                await self.limiter.pause(error.retry_after)
            raise
        if self.limiter.rate.tokens is not None:
            await self.limiter.settle(ticket, charged_tokens(response.usage))
        return response

    async def aclose(self) -> None:
        close = getattr(self.model, "aclose", None)
        if close is not None:
            await close()
