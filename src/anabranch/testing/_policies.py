"""Where the local server's answers come from: any ``Model``, or a fixed script."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from anabranch.messages import (
    Block,
    ModelRequest,
    ModelResponse,
    TextBlock,
    ToolUseBlock,
)
from anabranch.models._base import Model

__all__ = ["ScriptEntry", "ScriptExhaustedError", "ScriptedPolicy", "as_policy"]

ScriptEntry = ModelResponse | str | Sequence[Block]


class ScriptExhaustedError(RuntimeError):
    """A ``ScriptedPolicy`` was asked for more responses than it holds."""


def _response(entry: ScriptEntry, request: ModelRequest) -> ModelResponse:
    if isinstance(entry, ModelResponse):
        return entry
    content: tuple[Block, ...] = (
        (TextBlock(text=entry),) if isinstance(entry, str) else tuple(entry)
    )
    stop = "tool_use" if any(isinstance(b, ToolUseBlock) for b in content) else "end_turn"
    return ModelResponse(model=request.model, content=content, stop_reason=stop)


class ScriptedPolicy:
    """Answers requests with a fixed list of responses, in order.

    Entries are ``ModelResponse``s, strings (one text block) or lists of blocks. Asking for
    more than the script holds raises ``ScriptExhaustedError`` (the server answers 500).
    Every request is kept in ``requests``.
    """

    def __init__(self, script: Iterable[ScriptEntry]) -> None:
        self.script: list[ScriptEntry] = list(script)
        self.requests: list[ModelRequest] = []

    @property
    def remaining(self) -> int:
        """Responses not used yet."""
        return max(0, len(self.script) - len(self.requests))

    async def request(self, request: ModelRequest) -> ModelResponse:
        index = len(self.requests)
        self.requests.append(request)
        if index >= len(self.script):
            raise ScriptExhaustedError(
                f"ScriptedPolicy has {len(self.script)} responses; request {index + 1} has none"
            )
        return _response(self.script[index], request)


def as_policy(policy: Model | Iterable[ScriptEntry] | None) -> Model:
    """``policy`` as a ``Model``: models pass through, sequences become a ``ScriptedPolicy``."""
    if policy is None:
        from anabranch.testing._models import TestModel

        return TestModel()
    if isinstance(policy, Model):
        return policy
    if isinstance(policy, str | ModelResponse):
        return ScriptedPolicy([policy])
    return ScriptedPolicy(policy)
