"""The one small interface every model client implements."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from anabranch.messages import ModelRequest, ModelResponse

__all__ = ["Model"]


@runtime_checkable
class Model(Protocol):
    """A model client: one request in, one complete response out.

    Implementations raise ``anabranch.errors.ModelError`` subclasses and do not retry
    themselves: the runtime retries so that every attempt is recorded in the store.
    """

    async def request(self, request: ModelRequest) -> ModelResponse: ...
