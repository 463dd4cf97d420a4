"""The normalized message model every layer speaks.

Close to the Messages API wire shape (text, tool_use, tool_result blocks) so nothing is lost
in translation, but our own types: provider types stay inside the model clients.

The facade of three private modules below it: the blocks and messages
(``_message_model``), their canonical JSON and digests (``_message_json``), and a model
call's request, response and usage (``_model_request``).
"""

from __future__ import annotations

from anabranch._media import IMAGE_MEDIA_TYPES, Document, Image, sniff_image_type
from anabranch._message_json import (
    message_content_json,
    message_digest,
    messages_from_json,
    messages_to_json,
)
from anabranch._message_model import (
    Attachment,
    Block,
    CacheTTL,
    Message,
    MessageList,
    RawBlock,
    RedactedThinkingBlock,
    SystemBlock,
    TextBlock,
    ThinkingBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)
from anabranch._model_request import ModelRequest, ModelResponse, StopReason, Usage
from anabranch._model_settings import ModelSettings, ToolChoice
from anabranch._text import ValidText, canonical_json, valid_json, valid_text

__all__ = [
    "Attachment",
    "Block",
    "CacheTTL",
    "Document",
    "IMAGE_MEDIA_TYPES",
    "Image",
    "Message",
    "MessageList",
    "ModelRequest",
    "ModelResponse",
    "ModelSettings",
    "RawBlock",
    "RedactedThinkingBlock",
    "StopReason",
    "SystemBlock",
    "TextBlock",
    "ThinkingBlock",
    "ToolChoice",
    "ToolDefinition",
    "ToolResultBlock",
    "ToolUseBlock",
    "Usage",
    "ValidText",
    "canonical_json",
    "message_content_json",
    "message_digest",
    "messages_from_json",
    "messages_to_json",
    "sniff_image_type",
    "valid_json",
    "valid_text",
]
