"""Messages API wire format, the response side: ``ModelResponse`` -> JSON and SSE events,
and the API's error bodies (the request side is ``_wire``)."""

from __future__ import annotations

import json
import math
from typing import Any

from anabranch.messages import (
    Block,
    ModelResponse,
    RawBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
)

__all__ = ["error_body", "message_json", "sse_event", "stream_events", "usage_json"]


def usage_json(usage: Usage) -> dict[str, Any]:
    """The API's ``usage`` object."""
    payload: dict[str, Any] = {
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": usage.cache_creation_5m_input_tokens,
            "ephemeral_1h_input_tokens": usage.cache_creation_1h_input_tokens,
        },
        "output_tokens": usage.output_tokens,
        "service_tier": "standard",
    }
    if usage.thinking_tokens:
        payload["output_tokens_details"] = {"thinking_tokens": usage.thinking_tokens}
    return payload


def _block_json(block: Block) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ToolUseBlock):
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    if isinstance(block, ThinkingBlock):
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    if isinstance(block, RedactedThinkingBlock):
        return {"type": "redacted_thinking", "data": block.data}
    if isinstance(block, RawBlock) and block.block.get("type") == "compaction":
        return dict(block.block)
    raise ValueError(f"a model response cannot contain {block.type} blocks")


def message_json(
    response: ModelResponse, diagnostics: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The API's ``Message`` object for a complete response."""
    payload: dict[str, Any] = {
        "id": response.id,
        "type": "message",
        "role": "assistant",
        "model": response.model,
        "content": [_block_json(b) for b in response.content],
        "stop_reason": response.stop_reason,
        "stop_sequence": None,
        "usage": usage_json(response.usage),
    }
    if diagnostics is not None:
        payload["diagnostics"] = diagnostics
    return payload


def error_body(error_type: str, message: str, request_id: str) -> dict[str, Any]:
    """The API's error envelope."""
    return {
        "type": "error",
        "error": {"type": error_type, "message": message},
        "request_id": request_id,
    }


def sse_event(data: dict[str, Any]) -> bytes:
    """One server-sent event, named after its ``type``."""
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


def _pieces(text: str, count: int = 3) -> list[str]:
    """``text`` split into at most ``count`` roughly equal non-empty pieces."""
    if not text:
        return []
    size = math.ceil(len(text) / count)
    return [text[i : i + size] for i in range(0, len(text), size)]


def stream_events(
    response: ModelResponse, diagnostics: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The SSE events the API streams for ``response``, in order (``ping`` included)."""
    start = message_json(response, diagnostics)
    start.update(content=[], stop_reason=None)
    start["usage"] = {**start["usage"], "output_tokens": min(1, response.usage.output_tokens)}
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": start},
        {"type": "ping"},
    ]
    for index, block in enumerate(response.content):
        deltas: list[dict[str, Any]]
        if isinstance(block, TextBlock):
            opening: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in _pieces(block.text)]
        elif isinstance(block, ToolUseBlock):
            opening = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": p}
                for p in ["", *_pieces(json.dumps(block.input))]
            ]
        elif isinstance(block, ThinkingBlock):
            opening = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": p} for p in _pieces(block.thinking)]
            deltas.append({"type": "signature_delta", "signature": block.signature})
        elif isinstance(block, RedactedThinkingBlock):
            opening = {"type": "redacted_thinking", "data": block.data}
            deltas = []
        elif isinstance(block, RawBlock) and block.block.get("type") == "compaction":
            # the summary arrives in one compaction_delta; the signature with the start
            whole = dict(block.block)
            opening = {**whole, "content": None}
            deltas = [{"type": "compaction_delta", "content": whole.get("content"),
                       "encrypted_content": whole.get("encrypted_content")}]  # fmt: skip
        else:
            raise ValueError(f"a model response cannot contain {block.type} blocks")
        events.append({"type": "content_block_start", "index": index, "content_block": opening})
        events.extend({"type": "content_block_delta", "index": index, "delta": d} for d in deltas)
        events.append({"type": "content_block_stop", "index": index})
    usage = usage_json(response.usage)
    del usage["cache_creation"], usage["service_tier"]
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": response.stop_reason, "stop_sequence": None},
            "usage": usage,
        }
    )
    events.append({"type": "message_stop"})
    return events
