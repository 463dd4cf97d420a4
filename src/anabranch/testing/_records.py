"""What the local Messages API server remembers about each request it served."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from anabranch.messages import ModelRequest, Usage
from anabranch.testing._faults import FaultKind

__all__ = ["RequestRecord"]


class RequestRecord(BaseModel):
    """One request the server answered (or dropped), in arrival order in ``server.log``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoint: Literal["messages", "count_tokens", "other"]
    request_id: str
    timestamp: float
    """Wall-clock time (``time.time()``) when the request arrived."""
    status: int
    """HTTP status; 200 for a stream that failed mid-way, 0 for a connection dropped unanswered."""
    model: str | None = None
    stream: bool = False
    message_id: str | None = None
    usage: Usage | None = None
    """Usage the server reported (input side from its cache accounting)."""
    error_type: str | None = None
    """The API error type sent (also set for a mid-stream ``error`` event)."""
    error_message: str | None = None
    fault: FaultKind | None = None
    """The fault injected into this request, if any."""
    request: ModelRequest | None = None
    """The parsed request, when it could be parsed."""
    compaction: bool = False
    """A compaction request (the ``compaction`` parameter): answered with one block."""
    dropped_thinking: tuple[str, ...] = ()
    """Paths (``messages.i.content.j``) of the thinking blocks removed before the model saw
    the request: they failed the prefix check under ``prefix_mismatch_behavior: "drop_block"``."""

    @property
    def input_tokens(self) -> int:
        """Uncached input tokens (0 when no usage was reported)."""
        return self.usage.input_tokens if self.usage else 0

    @property
    def cache_read_input_tokens(self) -> int:
        return self.usage.cache_read_input_tokens if self.usage else 0

    @property
    def cache_creation_input_tokens(self) -> int:
        return self.usage.cache_creation_input_tokens if self.usage else 0

    @property
    def output_tokens(self) -> int:
        return self.usage.output_tokens if self.usage else 0
