"""The local server's rate limits: token buckets per request, input and output tokens.

As the Messages API does it: each limit is a bucket of ``limit`` that refills
continuously (``limit`` per ``period``); a request takes one request and its
``max_tokens`` of output when it is admitted, and once answered it gives back the output
it did not use and takes its input (uncached input plus cache writes; cache reads are
free). A request that does not fit gets 429 ``rate_limit_error`` with ``retry-after``
(whole seconds, rounded up). Every answer carries ``anthropic-ratelimit-*`` headers:
limit, remaining (token counts rounded to the nearest thousand, as the API rounds them)
and reset (RFC 3339, when the bucket is full again, rounded up to the second).

The input side is charged after the answer (the server learns the cached share from its
cache accounting): a request is admitted while the input bucket holds anything, and a
large prompt may take it below zero, which the next requests wait out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime

from anabranch.messages import Usage
from anabranch.models._rate import CallRate

__all__ = ["ProviderBuckets"]

_NAMES = {"requests": "requests", "input-tokens": "input tokens", "output-tokens": "output tokens"}


class _Bucket:
    def __init__(self, capacity: int, period: float, now: float) -> None:
        self.capacity = capacity
        self.per_second = capacity / period
        self.level = float(capacity)
        self._stamp = now

    def refill(self, now: float) -> None:
        elapsed = max(0.0, now - self._stamp)
        self.level = min(float(self.capacity), self.level + elapsed * self.per_second)
        self._stamp = now

    def wait_for(self, need: float) -> float:
        """Seconds until ``need`` is in the bucket (capped at a full bucket)."""
        need = min(need, float(self.capacity))
        return 0.0 if self.level >= need else (need - self.level) / self.per_second

    def full_at(self, now: float) -> float:
        return now + max(0.0, self.capacity - self.level) / self.per_second


def _rfc3339(stamp: float) -> str:
    return datetime.fromtimestamp(math.ceil(stamp), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ProviderBuckets:
    """The buckets of one organisation (one server): admit, settle, and the headers."""

    def __init__(self, rate: CallRate, *, clock: Callable[[], float] = time.time) -> None:
        if rate.tokens is not None:
            raise ValueError(
                "the Messages API limits input and output tokens apart: give the server "
                "input_tokens and output_tokens, not tokens"
            )
        self.rate = rate
        self._clock = clock
        now = clock()
        self._buckets: dict[str, _Bucket] = {
            kind: _Bucket(limit, rate.period, now)
            for kind, limit in (
                ("requests", rate.requests),
                ("input-tokens", rate.input_tokens),
                ("output-tokens", rate.output_tokens),
            )
            if limit is not None
        }

    def _refill(self) -> float:
        now = self._clock()
        for bucket in self._buckets.values():
            bucket.refill(now)
        return now

    def admit(self, max_tokens: int) -> tuple[float, str | None]:
        """Take one request and ``max_tokens`` of output now, or say how long to wait and
        which limit refused: ``(0, None)`` when admitted."""
        self._refill()
        needs = {"requests": 1.0, "input-tokens": 1.0, "output-tokens": float(max_tokens)}
        waits = {
            kind: bucket.wait_for(needs[kind]) for kind, bucket in self._buckets.items()
        }
        refused = max(waits, key=lambda kind: waits[kind], default=None)
        if refused is not None and waits[refused] > 0:
            return waits[refused], refused
        for kind, need in (("requests", 1), ("output-tokens", max_tokens)):
            if kind in self._buckets:
                self._buckets[kind].level -= need
        return 0.0, None

    def settle(self, max_tokens: int, usage: Usage) -> None:
        """An admitted request was answered with ``usage``."""
        self._refill()
        output = self._buckets.get("output-tokens")
        if output is not None:
            output.level += max_tokens - min(usage.output_tokens, max_tokens)
        charged = self._buckets.get("input-tokens")
        if charged is not None:
            charged.level -= usage.input_tokens + usage.cache_creation_input_tokens

    def release(self, max_tokens: int) -> None:
        """An admitted request failed before any output: its output estimate comes back."""
        output = self._buckets.get("output-tokens")
        if output is not None:
            output.level += max_tokens

    def refusal(self, refused: str) -> str:
        bucket = self._buckets[refused]
        return (
            "This request would exceed your organization's rate limit of "
            f"{bucket.capacity:,} {_NAMES[refused]} per {self.rate.period:g} seconds. "
            "For details, refer to: https://docs.claude.com/en/api/rate-limits."
        )

    def headers(self) -> dict[str, str]:
        """The ``anthropic-ratelimit-*`` headers of an answer sent now."""
        now = self._refill()
        out: dict[str, str] = {}
        tightest: tuple[float, str] | None = None
        for kind, bucket in self._buckets.items():
            left = max(0, math.floor(bucket.level))
            if kind != "requests":
                left = min(bucket.capacity, int(round(left / 1000.0)) * 1000)
                share = bucket.level / bucket.capacity
                if tightest is None or share < tightest[0]:
                    tightest = (share, kind)
            out[f"anthropic-ratelimit-{kind}-limit"] = str(bucket.capacity)
            out[f"anthropic-ratelimit-{kind}-remaining"] = str(left)
            out[f"anthropic-ratelimit-{kind}-reset"] = _rfc3339(bucket.full_at(now))
        if tightest is not None:  # the most restrictive token limit in effect
            for part in ("limit", "remaining", "reset"):
                out[f"anthropic-ratelimit-tokens-{part}"] = out[
                    f"anthropic-ratelimit-{tightest[1]}-{part}"
                ]
        return out
