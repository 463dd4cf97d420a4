"""Retry policy for model calls: exponential backoff with jitter, honouring retry-after."""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from anabranch.errors import ModelAPIError, ModelError

__all__ = ["RetryPolicy"]


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
