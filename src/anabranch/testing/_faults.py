"""Fault injection for the local Messages API: one-shot queued faults and seeded random ones."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DEFAULT_LATENCY", "ERROR_FAULTS", "Fault", "FaultKind", "FaultPlan"]

FaultKind = Literal[
    "rate_limit",
    "overloaded",
    "server_error",
    "stream_error",
    "disconnect",
    "latency",
]
"""What goes wrong with one ``POST /v1/messages``.

- ``rate_limit``: HTTP 429 ``rate_limit_error`` with a ``retry-after`` header.
- ``overloaded``: HTTP 529 ``overloaded_error``.
- ``server_error``: HTTP 500 ``api_error``.
- ``stream_error``: HTTP 200, then an SSE ``error`` event (``overloaded_error``) mid-stream.
  A non-streaming request gets the 529 the real API answers with instead.
- ``disconnect``: the socket is closed in the middle of the response body.
- ``latency``: the answer is delayed by ``delay`` seconds, then served normally.
"""

DEFAULT_LATENCY = 0.1
"""Seconds a ``latency`` fault adds when it does not say."""

ERROR_FAULTS: tuple[FaultKind, ...] = tuple(k for k in get_args(FaultKind) if k != "latency")
"""The kinds random faults are drawn from by default (every kind that fails the request)."""


class Fault(BaseModel):
    """One fault to inject into the next ``POST /v1/messages``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: FaultKind
    retry_after: float | None = Field(default=None, ge=0)
    """``retry-after`` seconds (``rate_limit``, also sent with ``overloaded`` when set).
    ``None`` uses the server's ``retry_after`` setting for ``rate_limit``."""
    delay: float | None = Field(default=None, ge=0)
    """Seconds of added latency (``latency``); ``None`` means ``DEFAULT_LATENCY``."""

    @property
    def latency(self) -> float:
        """The delay this fault adds before the answer (0 unless it is a ``latency`` fault)."""
        if self.kind != "latency":
            return 0.0
        return DEFAULT_LATENCY if self.delay is None else self.delay


class FaultPlan:
    """Which fault, if any, the next request gets: queued ones first, then by chance."""

    def __init__(
        self,
        faults: Iterable[Fault | FaultKind] = (),
        *,
        rate: float = 0.0,
        seed: int | None = None,
        kinds: Sequence[FaultKind] = ERROR_FAULTS,
    ) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError("fault_rate must be between 0 and 1")
        if rate and not kinds:
            raise ValueError("fault_kinds must not be empty when fault_rate > 0")
        self.rate = rate
        self.kinds = tuple(kinds)
        self._random = random.Random(seed)
        self._queue: deque[Fault] = deque()
        for fault in faults:
            self.push(fault)

    def push(self, fault: Fault | FaultKind) -> None:
        """Queue a one-shot fault for the next request that has none queued before it."""
        self._queue.append(fault if isinstance(fault, Fault) else Fault(kind=fault))

    @property
    def pending(self) -> int:
        """How many queued faults have not been used yet."""
        return len(self._queue)

    def next(self) -> Fault | None:
        """The fault for the request being served now (consumes it)."""
        if self._queue:
            return self._queue.popleft()
        if self.rate and self._random.random() < self.rate:
            return Fault(kind=self._random.choice(self.kinds))
        return None
