"""Rate limits on model calls, as the Messages API limits a team: requests, input tokens
and output tokens per period (RPM, ITPM, OTPM), shared by every caller.

``RateLimitedModel(model, limiter)`` is a ``Model`` that asks ``limiter`` for a slot
before each call and, after it, tells the limiter what the call really used.

What a call is charged, in each kind of limit (as the API counts them):

- ``requests``: 1.
- ``input_tokens`` (ITPM): at the grant, the estimated prompt (all of it: the cache reads
  are not known yet); at the end, the uncached input plus the cache writes. Cache reads do
  not count, as they do not count toward the API's input limit.
- ``output_tokens`` (OTPM): at the grant, the request's ``max_tokens`` (the most it can
  produce, thinking included); at the end, the output it produced. So the output limit
  holds for calls still running: no call can end above its grant.
- ``tokens``: the two together (input as above plus output), for a channel that limits
  all tokens at once.

The limit is a sliding window: over any ``period`` seconds, at most the limit is granted.
The API refills a token bucket of the same size continuously instead; a window never
grants more than such a bucket admits (see docs/design-notes.md, issue 17). A call whose
charge alone exceeds a limit waits for an empty window, then runs.

The provider's word wins: a 429 or 529 with ``retry-after``, and an answer whose
``anthropic-ratelimit-*`` headers say a limit has nothing left until its reset, pause the
limiter until then, so every caller sharing it waits, not only the one that was told.

Limiters: ``LocalCallLimiter`` (one process: ``anabranch run --rpm``),
``PostgresCallLimiter`` (every process on one PostgreSQL: ``anabranch worker --rpm``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import anyio
from pydantic import BaseModel, ConfigDict, Field, model_validator

from anabranch.context._tokens import estimate_request
from anabranch.errors import OverloadedError, RateLimitedError
from anabranch.messages import ModelRequest, ModelResponse, Usage
from anabranch.models._base import DeltaSink, Model, StreamingModel
from anabranch.models._provider_limits import HeaderWatch, watch_headers

__all__ = [
    "CallLimiter",
    "CallRate",
    "Charge",
    "LocalCallLimiter",
    "RateLimitedModel",
    "admission_wait",
    "fits_now",
]

MARGIN = 0.002
"""Seconds added to a computed wait, so the slot it waits for has surely left the window."""


class Charge(NamedTuple):
    """What one call counts against the token limits."""

    input: int = 0
    """Input tokens: the estimated prompt at the grant; uncached input plus cache writes
    once the call ended."""
    output: int = 0
    """Output tokens: ``max_tokens`` at the grant; the output produced once it ended."""

    @property
    def tokens(self) -> int:
        return self.input + self.output

    @classmethod
    def estimate(cls, request: ModelRequest) -> Charge:
        """The charge of ``request`` before it runs."""
        return cls(estimate_request(request), request.max_tokens)

    @classmethod
    def used(cls, usage: Usage) -> Charge:
        """The charge of a call that ended with ``usage``."""
        return cls(usage.input_tokens + usage.cache_creation_input_tokens, usage.output_tokens)


class CallRate(BaseModel):
    """Per ``period`` seconds: at most ``requests`` calls, ``input_tokens`` input tokens,
    ``output_tokens`` output tokens and ``tokens`` tokens in all (each optional)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests: int | None = Field(None, ge=1)
    """Calls started per period (RPM)."""
    input_tokens: int | None = Field(None, ge=1)
    """Uncached input plus cache writes per period (ITPM)."""
    output_tokens: int | None = Field(None, ge=1)
    """Output tokens per period, ``max_tokens`` charged at the grant (OTPM)."""
    tokens: int | None = Field(None, ge=1)
    """Input and output tokens together per period (a combined TPM)."""
    period: float = Field(60.0, gt=0, le=86_400)
    name: str = Field("default", min_length=1, max_length=200)
    """Which limit: callers sharing a name share it (one per API key and model class)."""

    @model_validator(mode="after")
    def _some_limit(self) -> CallRate:
        limits = (self.requests, self.input_tokens, self.output_tokens, self.tokens)
        if all(limit is None for limit in limits):
            raise ValueError(
                "a call rate needs at least one limit: requests, input_tokens, output_tokens "
                "or tokens per period"
            )
        return self

    @property
    def counts_tokens(self) -> bool:
        return any(v is not None for v in (self.input_tokens, self.output_tokens, self.tokens))


@runtime_checkable
class CallLimiter(Protocol):
    """Grants model calls under a ``CallRate``."""

    rate: CallRate

    async def acquire(self, charge: Charge) -> int:
        """Wait for room for one call of ``charge`` (its estimate); returns its ticket."""
        ...

    async def settle(self, ticket: int, charge: Charge) -> None:
        """The call of ``ticket`` used ``charge`` (replaces its estimate)."""
        ...

    async def pause(self, seconds: float) -> None:
        """Grant nothing for ``seconds`` (the provider said wait)."""
        ...


def _until_fits(
    live: Sequence[tuple[float, Charge]], limit: int, part: Callable[[Charge], int], need: int
) -> float | None:
    """When the oldest grants whose ``part`` covers the excess have left (None: it fits)."""
    excess = sum(part(charge) for _, charge in live) + need - limit
    if excess <= 0 or not live:
        return None
    freed, last = 0, len(live) - 1
    for index, (_, charge) in enumerate(live):
        freed += part(charge)
        if freed >= excess:
            last = index
            break
    return live[last][0]


def _input(charge: Charge) -> int:
    return charge.input


def _output(charge: Charge) -> int:
    return charge.output


def _total(charge: Charge) -> int:
    return charge.input + charge.output


def fits_now(rate: CallRate, count: int, used: Charge, charge: Charge) -> bool:
    """Whether a call of ``charge`` fits beside ``count`` live grants charged ``used`` in
    all (the quick check: the window's totals, no slot looked at)."""
    if rate.requests is not None and count + 1 > rate.requests:
        return False
    for limit, taken, need in (
        (rate.input_tokens, used.input, charge.input),
        (rate.output_tokens, used.output, charge.output),
        (rate.tokens, used.input + used.output, charge.input + charge.output),
    ):
        if limit is not None and taken + need > limit:
            return False
    return True


def admission_wait(
    now: float,
    window: Sequence[tuple[float, Charge]],
    rate: CallRate,
    blocked_until: float,
    charge: Charge,
) -> float:
    """Seconds until a call of ``charge`` fits (0: now). ``window``: the calls granted so
    far, ``(granted at, charge)``, oldest first; ``blocked_until``: a pause."""
    live = [slot for slot in window if slot[0] > now - rate.period]
    waits = [blocked_until - now]
    if rate.requests is not None and len(live) >= rate.requests:
        # the (len - limit + 1) oldest must leave the window first
        waits.append(live[len(live) - rate.requests][0] + rate.period - now)
    for limit, part in (
        (rate.input_tokens, _input),
        (rate.output_tokens, _output),
        (rate.tokens, _total),
    ):
        if limit is not None:
            oldest = _until_fits(live, limit, part, part(charge))
            if oldest is not None:
                waits.append(oldest + rate.period - now)
    wait = max(waits)
    return wait + MARGIN if wait > 0 else 0.0


@dataclass
class _Slot:
    granted: float
    charge: Charge
    ticket: int


class LocalCallLimiter:
    """A ``CallLimiter`` for the callers of one process (monotonic clock, no I/O)."""

    def __init__(self, rate: CallRate, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self._clock = clock
        self._slots: deque[_Slot] = deque()
        self._input = self._output = 0  # the live slots' totals
        self._blocked_until = 0.0
        self._next_ticket = 0
        self._turn = anyio.Lock()  # first come, first served

    async def acquire(self, charge: Charge) -> int:
        async with self._turn:
            while True:
                now = self._clock()
                slots = self._slots
                while slots and slots[0].granted <= now - self.rate.period:
                    gone = slots.popleft().charge
                    self._input -= gone.input
                    self._output -= gone.output
                used = Charge(self._input, self._output)
                if self._blocked_until <= now and fits_now(self.rate, len(slots), used, charge):
                    wait = 0.0
                else:
                    window = [(slot.granted, slot.charge) for slot in slots]
                    wait = admission_wait(now, window, self.rate, self._blocked_until, charge)
                if wait <= 0:
                    self._next_ticket += 1
                    slots.append(_Slot(now, charge, self._next_ticket))
                    self._input += charge.input
                    self._output += charge.output
                    return self._next_ticket
                await anyio.sleep(wait)

    async def settle(self, ticket: int, charge: Charge) -> None:
        for slot in reversed(self._slots):  # the newest first: calls are short
            if slot.ticket == ticket:
                self._input += charge.input - slot.charge.input
                self._output += charge.output - slot.charge.output
                slot.charge = charge
                return

    async def pause(self, seconds: float) -> None:
        self._blocked_until = max(self._blocked_until, self._clock() + max(seconds, 0.0))


class RateLimitedModel:
    """A ``Model`` whose calls ``limiter`` grants (see the module docstring).

    The API's limits are per model class: ``by_model`` gives a class its own limiter, by
    model-name prefix (``{"claude-opus": opus_limiter}``; the longest prefix that matches
    a request's model wins, and ``limiter`` grants every other model's calls).
    """

    def __init__(
        self,
        model: Model,
        limiter: CallLimiter,
        *,
        by_model: Mapping[str, CallLimiter] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(model, Model):
            raise TypeError(f"RateLimitedModel needs a Model, got {type(model).__name__}")
        for each in (limiter, *(by_model or {}).values()):
            if not isinstance(each, CallLimiter):
                raise TypeError(f"RateLimitedModel needs CallLimiters, got {type(each).__name__}")
        if any(not prefix for prefix in by_model or {}):
            raise ValueError("by_model needs model-name prefixes, not an empty string")
        self.model = model
        self.limiter = limiter
        self.by_model: dict[str, CallLimiter] = dict(
            sorted((by_model or {}).items(), key=lambda item: -len(item[0]))
        )
        self._wall_clock = wall_clock  # the provider's resets are wall-clock times

    def limiter_for(self, model: str) -> CallLimiter:
        """The limiter that grants calls to ``model``."""
        for prefix, limiter in self.by_model.items():
            if model.startswith(prefix):
                return limiter
        return self.limiter

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
        limiter = self.limiter_for(request.model)
        ticket = await limiter.acquire(Charge.estimate(request))
        with watch_headers() as watch:
            try:
                response = await call()
            except (RateLimitedError, OverloadedError) as error:
                await self._heed(limiter, watch, error.retry_after)
                raise
        if limiter.rate.counts_tokens:
            await limiter.settle(ticket, Charge.used(response.usage))
        await self._heed(limiter, watch, None)
        return response

    async def _heed(
        self, limiter: CallLimiter, watch: HeaderWatch, retry_after: float | None
    ) -> None:
        """Pause the shared limit for as long as the provider said to wait, if at all."""
        if retry_after is None and not watch.says_exhausted():
            return  # the common answer: something left, no wait asked (nothing parsed)
        wait = watch.limits().wait(self._wall_clock())
        if retry_after is not None:
            wait = max(wait, retry_after)
        if wait > 0:
            await limiter.pause(wait)

    async def aclose(self) -> None:
        close = getattr(self.model, "aclose", None)
        if close is not None:
            await close()
