"""Retry policy for model calls: exponential backoff with jitter, honouring retry-after."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from pydantic import BaseModel, ConfigDict, Field

from anabranch.errors import ModelAPIError, ModelError, PromptTooLongError

__all__ = ["RetryPolicy", "retrying"]

T = TypeVar("T")


class RetryPolicy(BaseModel):
    """How often and how patiently a failed model call is tried again."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attempts: int = Field(6, ge=1)
    base_delay: float = Field(0.5, ge=0)
    max_delay: float = Field(30.0, ge=0)
    max_retry_after: float = Field(120.0, ge=0)
    """Longest server-requested wait that is honoured as-is."""

    def delay(self, attempt: int, error: ModelError) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (attempts count from 1)."""
        if isinstance(error, ModelAPIError) and error.retry_after is not None:
            return min(max(error.retry_after, 0.0), self.max_retry_after)
        backoff = min(self.base_delay * 2.0 ** (attempt - 1), self.max_delay)
        return backoff * (1 - 0.25 * random.random())

    def should_retry(self, attempt: int, error: ModelError) -> bool:
        return error.retryable and attempt < self.max_attempts


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
    The one retry loop of model calls: the agent loop's and the summarizer's.
    """
    n = 0
    while True:
        n += 1
        try:
            return await attempt(n)
        except ModelError as error:
            if isinstance(error, PromptTooLongError) or not policy.should_retry(n, error):
                raise
            delay = policy.delay(n, error)
            if on_retry is not None:
                on_retry(error, delay, n)
        await anyio.sleep(delay)
