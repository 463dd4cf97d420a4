"""Small builders shared by tests."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from anabranch.messages import Block, ModelRequest, TextBlock, ToolUseBlock

_ids = itertools.count(1)


def call(tool_name: str, /, **arguments: Any) -> ToolUseBlock:
    """A tool_use block with a fresh id."""
    return ToolUseBlock(id=f"toolu_{next(_ids):04d}", name=tool_name, input=arguments)


def script(*turns: Sequence[Block] | str) -> Callable[[ModelRequest], list[Block]]:
    """A FunctionModel function answering successive calls with the given turns."""
    remaining = list(turns)

    def respond(request: ModelRequest) -> list[Block]:
        if not remaining:
            raise AssertionError("the model was called more often than scripted")
        turn = remaining.pop(0)
        return [TextBlock(text=turn)] if isinstance(turn, str) else list(turn)

    return respond
