"""The message model: content blocks, ``Message`` and the prompt's parts (system blocks,
tool definitions), as validated frozen pydantic models (re-exported by ``messages``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from anabranch._media import Document, Image
from anabranch._text import ValidJSONObject as _ValidJSONObject
from anabranch._text import ValidText, canonical_json, valid_text

__all__ = [
    "CACHE_TTLS",
    "Attachment",
    "Block",
    "CacheTTL",
    "Frozen",
    "Message",
    "MessageList",
    "RawBlock",
    "RedactedThinkingBlock",
    "SystemBlock",
    "TextBlock",
    "ThinkingBlock",
    "ToolDefinition",
    "ToolResultBlock",
    "ToolUseBlock",
]

CacheTTL = Literal["5m", "1h"]
CACHE_TTLS = ("5m", "1h")


class Frozen(BaseModel):
    """The base of the message model's classes: immutable, no unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class TextBlock(Frozen):
    type: Literal["text"] = "text"
    text: ValidText


class ThinkingBlock(Frozen):
    """The model's visible reasoning. Sent back exactly as received (the API checks
    ``signature``); never edited, only dropped with a summarized range."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str


class RedactedThinkingBlock(Frozen):
    """Reasoning the API encrypted: only the opaque ``data`` travels, unchanged."""

    type: Literal["redacted_thinking"] = "redacted_thinking"
    data: str


class RawBlock(Frozen):
    """A response block of a kind this model does not name (e.g. a server tool's), kept
    exactly as the API sent it and sent back the same way: nothing is dropped."""

    type: Literal["raw"] = "raw"
    block: dict[str, Any]


Attachment = Annotated[Image | Document, Field(discriminator="type")]
"""An image or document inside a tool result."""


class ToolUseBlock(Frozen):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: _ValidJSONObject


class ToolResultBlock(Frozen):
    """A tool's answer: its text, then any images or documents it returned (in order)."""

    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: ValidText
    is_error: bool = False
    attachments: tuple[Attachment, ...] = Field((), exclude_if=lambda value: not value)


Block = Annotated[
    TextBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ToolUseBlock
    | ToolResultBlock
    | Image
    | Document
    | RawBlock,
    Field(discriminator="type"),
]


class Message(Frozen):
    """One turn of a conversation."""

    role: Literal["user", "assistant"]
    content: tuple[Block, ...]

    @classmethod
    def user(cls, text: str) -> Message:
        if cls is Message and type(text) is str:
            return _user_text(text)
        return cls(role="user", content=(TextBlock(text=text),))

    @property
    def text(self) -> str:
        """All text blocks joined (tool payloads excluded)."""
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    @property
    def tool_uses(self) -> list[ToolUseBlock]:
        return [b for b in self.content if isinstance(b, ToolUseBlock)]

    @property
    def tool_results(self) -> list[ToolResultBlock]:
        return [b for b in self.content if isinstance(b, ToolResultBlock)]

    @property
    def thinking_blocks(self) -> list[ThinkingBlock | RedactedThinkingBlock]:
        return [b for b in self.content if isinstance(b, ThinkingBlock | RedactedThinkingBlock)]

    @property
    def attachments(self) -> list[Image | Document]:
        """Images and documents, also those inside tool results, in order."""
        found: list[Image | Document] = []
        for block in self.content:
            if isinstance(block, Image | Document):
                found.append(block)
            elif isinstance(block, ToolResultBlock):
                found.extend(block.attachments)
        return found

    def char_count(self) -> int:
        """Characters of the text parts (images and documents are counted apart)."""
        total = 0
        for block in self.content:
            if type(block) is ToolResultBlock:  # the usual block told apart with no call
                total += len(block.content)
            elif isinstance(block, TextBlock):  # (an exact match needs no call either)
                total += len(block.text)
            elif isinstance(block, ToolUseBlock):
                total += len(block.name) + len(canonical_json(block.input))
            elif isinstance(block, ToolResultBlock):
                total += len(block.content)
            elif isinstance(block, ThinkingBlock):
                total += len(block.thinking) + len(block.signature)
            elif isinstance(block, RedactedThinkingBlock):
                total += len(block.data)
            elif isinstance(block, Document) and block.text is not None:
                total += len(block.text)
        return total


MessageList = TypeAdapter(list[Message])

_TEXT_FIELDS = {"text"}
_USER_FIELDS = {"role", "content"}
"""The fields set of ``Message.user``'s two models (shared: pydantic copies it for a
``model_copy``, and a frozen model never updates its own)."""


def _user_text(text: str) -> Message:
    """``Message(role="user", content=(TextBlock(text=text),))`` as validation builds it
    (the text through ``valid_text``, as ``ValidText`` does; the same fields set), equal
    in every way (``==``, JSON, ``repr``, hash). A run's task lives as long as the run:
    validation would give each of its two models a fields set of its own."""
    block = TextBlock.__new__(TextBlock)
    setattr_ = object.__setattr__
    setattr_(block, "__dict__", {"type": "text", "text": valid_text(text)})
    setattr_(block, "__pydantic_fields_set__", _TEXT_FIELDS)
    setattr_(block, "__pydantic_extra__", None)
    setattr_(block, "__pydantic_private__", None)
    message = Message.__new__(Message)
    setattr_(message, "__dict__", {"role": "user", "content": (block,)})
    setattr_(message, "__pydantic_fields_set__", _USER_FIELDS)
    setattr_(message, "__pydantic_extra__", None)
    setattr_(message, "__pydantic_private__", None)
    return message


class SystemBlock(Frozen):
    """One block of the system prompt; ``cache`` puts a cache breakpoint at its end."""

    text: ValidText
    cache: CacheTTL | None = None


class ToolDefinition(Frozen):
    """What the model is told about a tool."""

    name: str
    description: ValidText
    input_schema: dict[str, Any]
    cache: CacheTTL | None = None
