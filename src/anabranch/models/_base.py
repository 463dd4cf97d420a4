"""The one small interface every model client implements."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol, runtime_checkable

from anabranch.messages import ModelRequest, ModelResponse

__all__ = ["DeltaSink", "Model", "StreamingModel"]

DeltaSink = Callable[[Literal["text", "thinking"], str], None]
"""Receives each piece of text or thinking as the model produces it."""


@runtime_checkable
class Model(Protocol):
    """A model client: one request in, one complete response out.

    Implementations raise ``anabranch.errors.ModelError`` subclasses and do not retry
    themselves: the runtime retries so that every attempt is recorded in the store.
    """

    async def request(self, request: ModelRequest) -> ModelResponse: ...


@runtime_checkable
class StreamingModel(Protocol):
    """A model that can also report its output as it arrives (optional).

    The runtime uses ``request_streaming`` only while someone listens to events; the
    response it returns is the same complete one ``request`` would return.
    """

    async def request_streaming(
        self, request: ModelRequest, on_delta: DeltaSink
    ) -> ModelResponse: ...
