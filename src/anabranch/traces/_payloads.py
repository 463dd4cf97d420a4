"""How messages and usage become span attributes: OpenTelemetry GenAI message parts, the
usage counts (content only where the caller decided to capture it)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from anabranch.messages import (
    Document,
    Image,
    Message,
    RedactedThinkingBlock,
    SystemBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)

__all__ = [
    "arguments_content",
    "compact_json",
    "message_json",
    "message_parts",
    "request_content",
    "semconv_messages",
    "usage_attributes",
]


def compact_json(value: Any) -> str:
    """JSON without spaces, non-ASCII kept: how structured values go into attributes."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _attachment_part(block: Image | Document) -> dict[str, Any]:
    """An image or document as a span sees it: its kind and size, never its bytes."""
    part: dict[str, Any] = {"type": block.type, "media_type": block.media_type}
    if block.url is not None:
        part["source"] = "url"
    else:
        part["size"] = block.size
    return part


def message_parts(message: Message) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "content": block.text})
        elif isinstance(block, ToolUseBlock):
            parts.append(
                {"type": "tool_call", "id": block.id, "name": block.name, "arguments": block.input}
            )
        elif isinstance(block, ToolResultBlock):
            part: dict[str, Any] = {
                "type": "tool_call_response",
                "id": block.tool_use_id,
                "response": block.content,
            }
            if block.attachments:
                part["attachments"] = [_attachment_part(a) for a in block.attachments]
            parts.append(part)
        elif isinstance(block, ThinkingBlock):
            parts.append({"type": "reasoning", "content": block.thinking})
        elif isinstance(block, RedactedThinkingBlock):
            parts.append({"type": "reasoning", "redacted": True})
        elif isinstance(block, Image | Document):
            parts.append(_attachment_part(block))
    return parts


def message_json(message: Message) -> dict[str, Any]:
    """A message for ``input.value``/``output.value``: payloads of images and documents
    (and opaque thinking signatures) are replaced by their size."""
    content: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, Image | Document):
            content.append(_attachment_part(block))
        elif isinstance(block, ToolResultBlock) and block.attachments:
            dumped = block.model_dump(mode="json", exclude={"attachments"})
            dumped["attachments"] = [_attachment_part(a) for a in block.attachments]
            content.append(dumped)
        elif isinstance(block, ThinkingBlock):
            content.append({"type": "thinking", "thinking": block.thinking})
        elif isinstance(block, RedactedThinkingBlock):
            content.append({"type": "redacted_thinking"})
        else:
            content.append(block.model_dump(mode="json"))
    return {"role": message.role, "content": content}


def semconv_messages(messages: Sequence[Message]) -> str:
    return compact_json([{"role": m.role, "parts": message_parts(m)} for m in messages])


def usage_attributes(
    usage: Usage, into: dict[str, Any] | None = None, *, full: bool
) -> dict[str, Any]:
    """GenAI usage (input = uncached + cache read + cache write), added to ``into`` (a new
    dict by default) and returned, with the OpenInference reasoning count.

    The cache-write count goes under its current name (``cache_write``) and its former one
    (``cache_creation``), which Phoenix reads. ``full``: the OpenInference token counts
    Phoenix derives from these (``llm.token_count.*``) too.
    """
    attributes = {} if into is None else into
    total_input = usage.total_input_tokens
    output = usage.output_tokens
    read = usage.cache_read_input_tokens
    write = usage.cache_creation_input_tokens
    thinking = usage.thinking_tokens
    attributes["gen_ai.usage.input_tokens"] = total_input
    attributes["gen_ai.usage.output_tokens"] = output
    attributes["gen_ai.usage.cache_read.input_tokens"] = read
    attributes["gen_ai.usage.cache_write.input_tokens"] = write
    attributes["gen_ai.usage.cache_creation.input_tokens"] = write
    if full:
        attributes["llm.token_count.prompt"] = total_input
        attributes["llm.token_count.completion"] = output
        attributes["llm.token_count.total"] = total_input + output
        attributes["llm.token_count.prompt_details.cache_read"] = read
        attributes["llm.token_count.prompt_details.cache_write"] = write
    attributes["gen_ai.usage.reasoning.output_tokens"] = thinking
    attributes["llm.token_count.completion_details.reasoning"] = thinking
    return attributes


def request_content(
    messages: tuple[Message, ...], system: Sequence[SystemBlock] | None
) -> dict[str, Any]:
    """A model call's captured input (opt-in): built only for a span that records."""
    attributes: dict[str, Any] = {
        "gen_ai.input.messages": semconv_messages(messages),
        "input.value": compact_json([message_json(m) for m in messages]),
        "input.mime_type": "application/json",
    }
    if system:
        attributes["gen_ai.system_instructions"] = compact_json(
            [{"type": "text", "content": b.text} for b in system]
        )
    return attributes


def arguments_content(arguments: dict[str, Any]) -> dict[str, Any]:
    """A tool call's captured arguments (opt-in), encoded once for both keys."""
    encoded = compact_json(arguments)
    return {
        "gen_ai.tool.call.arguments": encoded,
        "input.value": encoded,
        "input.mime_type": "application/json",
    }
