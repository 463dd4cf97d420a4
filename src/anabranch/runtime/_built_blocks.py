"""A tool turn's result blocks and user message, built as validation would build them.

Every tool call makes a ``ToolResultBlock`` and every tool turn a ``Message`` of blocks the
runtime itself made. Validating them again (pydantic's ``__init__``) checks what is
already known; for parts of exactly the types validation keeps as they are, these build
the very model it would: the same field values (text through ``valid_text``, as the
``ValidText`` validator does), the same fields set, equal in every way (``==``, JSON,
``repr``, hash). Any other part (a ``str`` subclass, attachments, a block of another
class) goes through validation, so its errors and conversions are pydantic's.
"""

from __future__ import annotations

from anabranch._media import Document, Image
from anabranch._text import valid_text
from anabranch.messages import (
    Block,
    Message,
    RawBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

__all__ = ["result_block", "user_message"]

_RESULT_FIELDS = {"tool_use_id", "content", "is_error", "attachments"}
_MESSAGE_FIELDS = {"role", "content"}
"""The fields set of each shape (shared: pydantic copies it for a ``model_copy``, and a
frozen model never updates its own)."""

_TAGS: dict[type, str] = {
    TextBlock: "text",
    ThinkingBlock: "thinking",
    RedactedThinkingBlock: "redacted_thinking",
    ToolUseBlock: "tool_use",
    ToolResultBlock: "tool_result",
    Image: "image",
    Document: "document",
    RawBlock: "raw",
}
"""Each block class of the ``Block`` union and the tag its ``type`` field holds."""


def result_block(
    tool_use_id: str, content: str, is_error: bool, attachments: tuple[Image | Document, ...]
) -> ToolResultBlock:
    """``ToolResultBlock(tool_use_id=, content=, is_error=, attachments=)``."""
    if (
        type(tool_use_id) is str
        and type(content) is str
        and type(is_error) is bool
        and attachments == ()
        and type(attachments) is tuple
    ):
        block = ToolResultBlock.__new__(ToolResultBlock)
        values = {
            "type": "tool_result",
            "tool_use_id": tool_use_id,
            "content": content if content.isascii() else valid_text(content),
            "is_error": is_error,
            "attachments": (),
        }
        setattr_ = object.__setattr__  # as validation sets them (no per-shape helper call)
        setattr_(block, "__dict__", values)
        setattr_(block, "__pydantic_fields_set__", _RESULT_FIELDS)
        setattr_(block, "__pydantic_extra__", None)
        setattr_(block, "__pydantic_private__", None)
        return block
    return ToolResultBlock(
        tool_use_id=tool_use_id, content=content, is_error=is_error, attachments=attachments
    )


def user_message(content: tuple[Block, ...]) -> Message:
    """``Message(role="user", content=content)``."""
    if type(content) is tuple and content:
        for block in content:
            kind = type(block)
            if kind not in _TAGS or _TAGS[kind] != block.type:
                break
        else:
            message = Message.__new__(Message)
            setattr_ = object.__setattr__
            setattr_(message, "__dict__", {"role": "user", "content": content})
            setattr_(message, "__pydantic_fields_set__", _MESSAGE_FIELDS)
            setattr_(message, "__pydantic_extra__", None)
            setattr_(message, "__pydantic_private__", None)
            return message
    return Message(role="user", content=content)
