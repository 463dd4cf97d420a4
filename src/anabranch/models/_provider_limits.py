"""What the provider says about its rate limits: the ``anthropic-ratelimit-*`` headers.

Every Messages API answer (a 200, a 429, a 529) carries, for requests, input tokens and
output tokens, the limit, what remains and when the bucket is full again (RFC 3339), and
a 429 (or 529) may carry ``retry-after``. ``ProviderLimits.of(headers)`` reads them into a
typed record.

A model client reports the headers of the answer it got with ``saw_headers(headers)``;
they are kept only while someone watches the call (``watch_headers()``: the rate-limited
model does, around each call). Nothing is parsed, and nothing is kept, for a call nobody
watches: one context-variable lookup per call is the whole cost without a limiter.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from anabranch.models._errors import retry_after_seconds

__all__ = [
    "HeaderWatch",
    "LimitKind",
    "ProviderLimit",
    "ProviderLimits",
    "saw_headers",
    "watch_headers",
]

LimitKind = Literal["requests", "input-tokens", "output-tokens", "tokens"]
"""The header families: ``anthropic-ratelimit-{kind}-{limit,remaining,reset}``
(``tokens`` is the most restrictive token limit in effect)."""

KINDS: tuple[LimitKind, ...] = ("requests", "input-tokens", "output-tokens", "tokens")
PREFIX = "anthropic-ratelimit-"


class ProviderLimit(BaseModel):
    """One limit as the provider states it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    limit: int | None = None
    remaining: int | None = None
    """What is left now (token counts are rounded to the nearest thousand by the API)."""
    reset: float | None = None
    """When the bucket is full again, as a Unix time."""


class ProviderLimits(BaseModel):
    """The provider's rate-limit state after one answer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    limits: dict[LimitKind, ProviderLimit] = {}
    retry_after: float | None = None
    """Seconds the answer asked to wait (``retry-after-ms`` or ``retry-after``)."""

    @classmethod
    def of(cls, headers: Mapping[str, str] | None) -> ProviderLimits:
        """The limits ``headers`` state (empty when they state none; bad values ignored)."""
        if not headers:
            return cls()
        limits: dict[LimitKind, ProviderLimit] = {}
        for kind in KINDS:
            limit = _count(headers.get(f"{PREFIX}{kind}-limit"))
            remaining = _count(headers.get(f"{PREFIX}{kind}-remaining"))
            reset = _time(headers.get(f"{PREFIX}{kind}-reset"))
            if limit is not None or remaining is not None or reset is not None:
                limits[kind] = ProviderLimit(limit=limit, remaining=remaining, reset=reset)
        return cls(limits=limits, retry_after=retry_after_seconds(headers))

    def exhausted_until(self) -> float | None:
        """The Unix time until which the provider refuses every call: the latest reset of
        a limit with nothing remaining (``None``: none is exhausted)."""
        ends = [
            limit.reset
            for limit in self.limits.values()
            if limit.remaining == 0 and limit.reset is not None
        ]
        return max(ends) if ends else None

    def wait(self, now: float) -> float:
        """Seconds every caller should hold back from ``now`` (a Unix time): the longer of
        ``retry-after`` and an exhausted limit's reset; 0 when nothing says wait."""
        until = self.exhausted_until()
        waits = [self.retry_after or 0.0, (until - now) if until is not None else 0.0]
        return max(0.0, *waits)


def _count(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        return None
    return value if value >= 0 else None


def _time(raw: str | None) -> float | None:
    if not raw:
        return None
    try:
        stamp = datetime.fromisoformat(raw.strip())
    except ValueError:
        return None
    if stamp.tzinfo is None:  # RFC 3339 always has an offset; a bare time is not trusted
        return None
    value = stamp.timestamp()
    return value if math.isfinite(value) else None


class HeaderWatch:
    """The headers of the answer to one watched call (the last answer, if several)."""

    def __init__(self) -> None:
        self.headers: Mapping[str, str] | None = None

    def limits(self) -> ProviderLimits:
        return ProviderLimits.of(self.headers)

    def says_exhausted(self) -> bool:
        """Whether the headers name a limit with nothing left or ask to wait (a quick
        look, before anything is parsed)."""
        headers = self.headers
        if not headers:
            return False
        if headers.get("retry-after") or headers.get("retry-after-ms"):
            return True
        return any(headers.get(f"{PREFIX}{kind}-remaining", "").strip() == "0" for kind in KINDS)


_WATCH: ContextVar[HeaderWatch | None] = ContextVar("anabranch_header_watch", default=None)


@contextmanager
def watch_headers() -> Iterator[HeaderWatch]:
    """Keep the headers a model client reports during the ``with`` block (this task's)."""
    watch = HeaderWatch()
    token = _WATCH.set(watch)
    try:
        yield watch
    finally:
        _WATCH.reset(token)


def saw_headers(headers: Mapping[str, str] | None) -> None:
    """A model client got an answer with ``headers``: kept if the call is watched."""
    watch = _WATCH.get()
    if watch is not None and headers is not None:
        watch.headers = headers
