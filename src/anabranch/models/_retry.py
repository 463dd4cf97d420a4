"""Retry policy for model calls: exponential backoff with jitter, honouring retry-after.

Behind a gateway that retries on its own, the attempts multiply: LiteLLM's two retries
under six attempts of ours make up to eighteen upstream calls. Once an error shows a
gateway (``ModelAPIError.gateway``), the policy divides its attempts by the gateway's
(``gateway_retries``, by default the gateway's documented default), so a model call makes
about ``max_attempts`` upstream attempts in all, whichever side retries.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from pydantic import BaseModel, ConfigDict, Field

from anabranch.errors import (
    ModelAPIError,
    ModelError,
    OverloadedError,
    PromptTooLongError,
    RateLimitedError,
)
from anabranch.models._gateway import GATEWAY_DEFAULT_RETRIES

__all__ = ["RetryPolicy", "retrying"]

T = TypeVar("T")


class RetryPolicy(BaseModel):
    """How often and how patiently a failed model call is tried again."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attempts: int = Field(6, ge=1)
    """Upstream attempts per model call, counting a gateway's own retries."""
    base_delay: float = Field(0.5, ge=0)
    max_delay: float = Field(30.0, ge=0)
    max_retry_after: float = Field(120.0, ge=0)
    """Longest server-requested wait that is honoured as-is."""
    throttled_base_delay: float = Field(2.0, ge=0)
    """First wait after a rate limit or overload that came through a gateway without
    ``retry-after`` (LiteLLM drops it); doubled per attempt up to ``max_delay``."""
    gateway_retries: int | None = Field(None, ge=0)
    """Retries a detected gateway makes on its own per attempt of ours. ``None``: its
    documented default (LiteLLM: 2); set 0 once its retries are turned off."""

    def attempts_for(self, error: ModelError) -> int:
        """How many attempts of ours a call failing with ``error`` gets."""
        gateway = error.gateway if isinstance(error, ModelAPIError) else None
        if gateway is None:
            return self.max_attempts
        retries = self.gateway_retries
        if retries is None:
            retries = GATEWAY_DEFAULT_RETRIES.get(gateway, 0)
        return max(1, math.ceil(self.max_attempts / (1 + retries)))

    def delay(self, attempt: int, error: ModelError) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (attempts count from 1)."""
        if isinstance(error, ModelAPIError) and error.retry_after is not None:
            return min(max(error.retry_after, 0.0), self.max_retry_after)
        base = self.base_delay
        if isinstance(error, RateLimitedError | OverloadedError) and error.gateway:
            base = max(base, self.throttled_base_delay)
        backoff = min(base * 2.0 ** (attempt - 1), self.max_delay)
        return backoff * (1 - 0.25 * random.random())

    def should_retry(self, attempt: int, error: ModelError) -> bool:
        return error.retryable and attempt < self.attempts_for(error)

    def retry_delay(self, attempt: int, error: ModelError) -> float | None:
        """After attempt ``attempt`` failed with ``error``: seconds to wait before the next
        one, or ``None`` when ``error`` is to be raised (final, not retryable, or a prompt
        that is too long: that needs a smaller request, never the same one again).

        The one rule of model call retries: ``retrying``'s and the agent loop's turn's."""
        if isinstance(error, PromptTooLongError) or not self.should_retry(attempt, error):
            return None
        return self.delay(attempt, error)


async def retrying(
    policy: RetryPolicy,
    attempt: Callable[[int], Awaitable[T]],
    *,
    on_retry: Callable[[ModelError, float, int], None] | None = None,
) -> T:
    """``await attempt(n)`` for n = 1, 2, ... until it returns, retrying ``ModelError``s the
    policy calls retryable after the policy's delay. A prompt that is too long is never
    retried as is (it needs a smaller request): it is raised at once, as is a final error.

    ``on_retry(error, delay, n)`` is told of each retry before the wait (for tracing).
    The retry loop of model calls around one attempt (the summarizer's, a compaction
    step's); the agent loop's turn runs the same rule (``RetryPolicy.retry_delay``) in its
    own loop, so a call waiting for the model holds no retry coroutine of its own.
    """
    n = 0
    while True:
        n += 1
        try:
            return await attempt(n)
        except ModelError as error:
            delay = policy.retry_delay(n, error)
            if delay is None:
                raise
            if on_retry is not None:
                on_retry(error, delay, n)
        await anyio.sleep(delay)
