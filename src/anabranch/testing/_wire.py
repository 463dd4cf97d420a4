"""Messages API wire format: request JSON -> ``ModelRequest``, responses -> JSON and SSE.

Shape errors are reported the way the API does: ``<path>: <message>`` with pydantic-style
wording (``max_tokens: Field required``, ``...: Extra inputs are not permitted``).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from anabranch._thinking_models import thinking_always_on
from anabranch.messages import (
    IMAGE_MEDIA_TYPES,
    Attachment,
    Block,
    CacheTTL,
    Document,
    Image,
    Message,
    ModelRequest,
    ModelSettings,
    RawBlock,
    RedactedThinkingBlock,
    SystemBlock,
    TextBlock,
    ThinkingBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
    canonical_json,
    sniff_image_type,
)
from anabranch.testing._wire_out import (
    error_body,
    message_json,
    sse_event,
    stream_events,
    usage_json,
)
from anabranch.testing._wire_params import (
    Thinking,
    compaction_param,
    diagnostics_param,
    number_param,
    thinking_param,
    tool_choice_param,
)
from anabranch.testing._wire_shape import APIFailure
from anabranch.testing._wire_shape import as_dict as _dict
from anabranch.testing._wire_shape import as_list as _list
from anabranch.testing._wire_shape import as_str as _str
from anabranch.testing._wire_shape import fail as _fail
from anabranch.testing._wire_shape import no_extra as _no_extra
from anabranch.testing._wire_shape import required as _required

__all__ = [
    "APIFailure",
    "BlockRef",
    "WireRequest",
    "error_body",
    "message_json",
    "parse_body",
    "sse_event",
    "stream_events",
    "usage_json",
]

BlockRef = tuple[Literal["tool", "system", "message"], int, int]
"""Where a cache breakpoint sits: ("tool", i, 0), ("system", i, 0) or ("message", i, j)."""

_MESSAGE_FIELDS = frozenset(
    {
        "model", "messages", "max_tokens", "system", "tools", "tool_choice", "stream",
        "metadata", "stop_sequences", "temperature", "top_p", "top_k", "thinking",
        "cache_control", "service_tier", "container", "output_config", "inference_geo",
        "speed", "diagnostics", "user_profile_id", "workspace_id", "mcp_servers",
        "context_management", "compaction",
    }
)  # fmt: skip
_COUNT_FIELDS = frozenset(
    {
        "model", "messages", "system", "tools", "tool_choice", "thinking", "cache_control",
        "output_config", "speed", "mcp_servers", "context_management", "compaction",
    }
)  # fmt: skip
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
_TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")


@dataclass(frozen=True)
class WireRequest:
    """A parsed request body: our ``ModelRequest`` plus what only the wire knows."""

    request: ModelRequest
    stream: bool = False
    cache_marks: Mapping[BlockRef, CacheTTL] = field(default_factory=dict)
    """Every block carrying ``cache_control`` (including the automatic top-level one)."""
    breakpoint_count: int = 0
    """Blocks with ``cache_control`` plus one for a top-level ``cache_control``."""
    salt: str = ""
    """Request options that key the messages part of the cache (tool_choice, thinking)."""
    diagnostics: bool = False
    """The request asked for cache diagnostics."""
    previous_message_id: str | None = None
    thinking_type: str | None = None
    """``thinking.type`` as sent (``None``: no ``thinking`` parameter)."""
    compaction: bool = False
    """A compaction request (the ``compaction`` parameter): answered with the summary only."""
    compaction_instructions: str | None = None
    context_management: bool = False
    drop_mismatched_thinking: bool = False
    """``thinking.block_binding.prefix_mismatch_behavior`` is ``"drop_block"``."""


def _cache_ttl(obj: dict[str, Any], path: str) -> CacheTTL | None:
    raw = obj.get("cache_control")
    if raw is None:
        return None
    where = f"{path}.cache_control" if path else "cache_control"
    control = _dict(raw, where)
    _no_extra(control, frozenset({"type", "ttl"}), where)
    if control.get("type") != "ephemeral":
        _fail(f"{where}.type", "Input should be 'ephemeral'")
    ttl = control.get("ttl", "5m")
    if ttl not in ("5m", "1h"):
        _fail(f"{where}.ttl", "Input should be '5m' or '1h'")
    return "1h" if ttl == "1h" else "5m"


def _text(obj: dict[str, Any], path: str) -> str:
    _no_extra(obj, frozenset({"type", "text", "cache_control", "citations"}), path)
    return _str(_required(obj, "text", path), f"{path}.text")


def _base64(value: Any, path: str) -> bytes:
    text = _str(value, path)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        _fail(path, "Invalid base64 data")


def _url(obj: dict[str, Any], path: str) -> str:
    _no_extra(obj, frozenset({"type", "url"}), path)
    url = _str(_required(obj, "url", path), f"{path}.url")
    if not url.startswith(("https://", "http://")):
        _fail(f"{path}.url", "Input should be a valid URL")
    return url


_IMAGE_TYPES = "'image/jpeg', 'image/png', 'image/gif' or 'image/webp'"


def _image(obj: dict[str, Any], path: str) -> Image:
    _no_extra(obj, frozenset({"type", "source", "cache_control"}), path)
    source = _dict(_required(obj, "source", path), f"{path}.source")
    kind = source.get("type")
    where = f"{path}.source.{kind}"
    if kind == "url":
        return Image(url=_url(source, where))
    if kind != "base64":
        _fail(f"{path}.source.type", "Input should be 'base64' or 'url'")
    _no_extra(source, frozenset({"type", "media_type", "data"}), where)
    media_type = _required(source, "media_type", where)
    if media_type not in IMAGE_MEDIA_TYPES:
        _fail(f"{where}.media_type", f"Input should be {_IMAGE_TYPES}")
    data = _base64(_required(source, "data", where), f"{where}.data")
    found = sniff_image_type(data)
    if found is None:
        _fail(where, "Could not process image")
    if found != media_type:
        _fail(
            where,
            f"The image was specified using the {media_type} media type, but the image "
            f"appears to be a {found} image",
        )
    return Image(data=data, media_type=media_type)


def _document(obj: dict[str, Any], path: str) -> Document:
    allowed = frozenset({"type", "source", "cache_control", "title", "context", "citations"})
    _no_extra(obj, allowed, path)
    title = obj.get("title")
    context = obj.get("context")
    extra = {
        "title": None if title is None else _str(title, f"{path}.title"),
        "context": None if context is None else _str(context, f"{path}.context"),
    }
    source = _dict(_required(obj, "source", path), f"{path}.source")
    kind = source.get("type")
    where = f"{path}.source.{kind}"
    if kind == "url":
        return Document(url=_url(source, where), **extra)
    if kind == "text":
        _no_extra(source, frozenset({"type", "media_type", "data"}), where)
        if source.get("media_type") != "text/plain":
            _fail(f"{where}.media_type", "Input should be 'text/plain'")
        return Document(text=_str(_required(source, "data", where), f"{where}.data"), **extra)
    if kind != "base64":
        _fail(f"{path}.source.type", "Input should be 'base64', 'text' or 'url'")
    _no_extra(source, frozenset({"type", "media_type", "data"}), where)
    if source.get("media_type") != "application/pdf":
        _fail(f"{where}.media_type", "Input should be 'application/pdf'")
    data = _base64(_required(source, "data", where), f"{where}.data")
    if not data.startswith(b"%PDF-"):
        _fail(where, "The PDF specified was not valid.")
    return Document(data=data, **extra)


def _tool_result_content(value: Any, path: str) -> tuple[str, tuple[Attachment, ...]]:
    """A tool result's text and its images and documents (text and blocks may mix)."""
    if value is None:
        return "", ()
    if isinstance(value, str):
        return value, ()
    parts: list[str] = []
    attachments: list[Attachment] = []
    for k, item in enumerate(_list(value, path)):
        item_path = f"{path}.{k}"
        item = _dict(item, item_path)
        kind = item.get("type")
        if kind == "text":
            parts.append(_text(item, f"{item_path}.text"))
        elif kind == "image":
            attachments.append(_image(item, f"{item_path}.image"))
        elif kind == "document":
            attachments.append(_document(item, f"{item_path}.document"))
        else:
            _fail(f"{item_path}.type", _unsupported(kind))
    return "".join(parts), tuple(attachments)


def _unsupported(kind: Any) -> str:
    return f"content type {kind!r} is not supported by this local server"


def _block(raw: Any, path: str) -> tuple[Block, CacheTTL | None]:
    obj = _dict(raw, path)
    kind = obj.get("type")
    tagged = f"{path}.{kind}"
    if kind == "text":
        return TextBlock(text=_text(obj, tagged)), _cache_ttl(obj, tagged)
    if kind == "thinking":
        if "cache_control" in obj:
            _fail(f"{tagged}.cache_control", "Thinking blocks cannot be cached directly")
        _no_extra(obj, frozenset({"type", "thinking", "signature"}), tagged)
        thinking = _str(_required(obj, "thinking", tagged), f"{tagged}.thinking")
        signature = _str(_required(obj, "signature", tagged), f"{tagged}.signature")
        return ThinkingBlock(thinking=thinking, signature=signature), None
    if kind == "redacted_thinking":
        if "cache_control" in obj:
            _fail(f"{tagged}.cache_control", "Thinking blocks cannot be cached directly")
        _no_extra(obj, frozenset({"type", "data"}), tagged)
        data = _str(_required(obj, "data", tagged), f"{tagged}.data")
        return RedactedThinkingBlock(data=data), None
    if kind == "compaction":
        return _compaction_block(obj, tagged), _cache_ttl(obj, tagged)
    if kind == "image":
        return _image(obj, tagged), _cache_ttl(obj, tagged)
    if kind == "document":
        return _document(obj, tagged), _cache_ttl(obj, tagged)
    if kind == "tool_use":
        _no_extra(obj, frozenset({"type", "id", "name", "input", "cache_control"}), tagged)
        block_id = _str(_required(obj, "id", tagged), f"{tagged}.id")
        if not _TOOL_ID.match(block_id):
            _fail(f"{tagged}.id", "String should match pattern '^[a-zA-Z0-9_-]+$'")
        name = _str(_required(obj, "name", tagged), f"{tagged}.name")
        arguments = _dict(_required(obj, "input", tagged), f"{tagged}.input")
        block = ToolUseBlock(id=block_id, name=name, input=arguments)
        return block, _cache_ttl(obj, tagged)
    if kind == "tool_result":
        allowed = frozenset({"type", "tool_use_id", "content", "is_error", "cache_control"})
        _no_extra(obj, allowed, tagged)
        use_id = _str(_required(obj, "tool_use_id", tagged), f"{tagged}.tool_use_id")
        content, attachments = _tool_result_content(obj.get("content"), f"{tagged}.content")
        is_error = obj.get("is_error", False)
        if not isinstance(is_error, bool):
            _fail(f"{tagged}.is_error", "Input should be a valid boolean")
        result = ToolResultBlock(
            tool_use_id=use_id, content=content, is_error=is_error, attachments=attachments
        )
        return result, _cache_ttl(obj, tagged)
    if kind is None:
        _fail(f"{path}.type", "Field required")
    _fail(f"{path}.type", _unsupported(kind))


def _compaction_block(obj: dict[str, Any], path: str) -> RawBlock:
    """A ``compaction`` block as sent back (kept exactly, ``cache_control`` aside)."""
    allowed = {"type", "content", "encrypted_content", "signature", "cache_control", "tool_changes"}
    _no_extra(obj, frozenset(allowed), path)
    for key in ("content", "encrypted_content", "signature"):
        value = obj.get(key)
        if value is not None and not isinstance(value, str):
            _fail(f"{path}.{key}", "Input should be a valid string")
    if obj.get("content") == "":
        _fail(
            f"{path}.content",
            "compaction content cannot be empty; use null for a failed compaction",
        )
    return RawBlock(block={k: v for k, v in obj.items() if k != "cache_control"})


def _messages(
    raw: Any, marks: dict[BlockRef, CacheTTL]
) -> tuple[tuple[Message, ...], tuple[tuple[int, CacheTTL], ...]]:
    messages: list[Message] = []
    breakpoints: list[tuple[int, CacheTTL]] = []
    for i, item in enumerate(_list(raw, "messages")):
        path = f"messages.{i}"
        obj = _dict(item, path)
        _no_extra(obj, frozenset({"role", "content"}), path)
        role = _required(obj, "role", path)
        if role not in ("user", "assistant"):
            _fail(f"{path}.role", "Input should be 'user' or 'assistant'")
        content = _required(obj, "content", path)
        blocks: list[Block] = []
        if isinstance(content, str):
            if content:
                blocks.append(TextBlock(text=content))
        else:
            for j, raw_block in enumerate(_list(content, f"{path}.content")):
                block, ttl = _block(raw_block, f"{path}.content.{j}")
                blocks.append(block)
                if ttl is not None:
                    marks["message", i, j] = ttl
        if blocks and ("message", i, len(blocks) - 1) in marks:
            breakpoints.append((i, marks["message", i, len(blocks) - 1]))
        messages.append(Message(role=role, content=tuple(blocks)))
    return tuple(messages), tuple(breakpoints)


def _system(raw: Any, marks: dict[BlockRef, CacheTTL]) -> tuple[SystemBlock, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (SystemBlock(text=raw),) if raw else ()
    blocks = []
    for i, item in enumerate(_list(raw, "system")):
        path = f"system.{i}"
        obj = _dict(item, path)
        if obj.get("type") != "text":
            _fail(f"{path}.type", "Input should be 'text'")
        text = _text(obj, path)
        if not text:
            _fail("system", "text content blocks must be non-empty")
        ttl = _cache_ttl(obj, path)
        if ttl is not None:
            marks["system", i, 0] = ttl
        blocks.append(SystemBlock(text=text, cache=ttl))
    return tuple(blocks)


def _tools(raw: Any, marks: dict[BlockRef, CacheTTL]) -> tuple[ToolDefinition, ...]:
    if raw is None:
        return ()
    tools = []
    allowed = frozenset({"type", "name", "description", "input_schema", "cache_control"})
    for i, item in enumerate(_list(raw, "tools")):
        obj = _dict(item, f"tools.{i}")
        kind = obj.get("type", "custom")
        if kind != "custom":
            _fail(f"tools.{i}.type", f"tool type {kind!r} is not supported by this local server")
        path = f"tools.{i}.custom"
        _no_extra(obj, allowed, path)
        name = _str(_required(obj, "name", path), f"{path}.name")
        if not _TOOL_NAME.match(name):
            _fail(f"{path}.name", "String should match pattern '^[a-zA-Z0-9_-]{1,128}$'")
        description = _str(obj.get("description", ""), f"{path}.description")
        schema = _dict(_required(obj, "input_schema", path), f"{path}.input_schema")
        ttl = _cache_ttl(obj, path)
        if ttl is not None:
            marks["tool", i, 0] = ttl
        tools.append(
            ToolDefinition(name=name, description=description, input_schema=schema, cache=ttl)
        )
    return tuple(tools)


def _settings(body: dict[str, Any], thinking: Thinking) -> ModelSettings:
    """The request's sampling, thinking and tool-choice options (shape-checked only: the
    rules between them are ``validate``'s)."""
    top_k = body.get("top_k")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool)):
        _fail("top_k", "Input should be a valid integer")
    stops = body.get("stop_sequences") or []
    tier = body.get("service_tier")
    if tier is not None and tier not in ("auto", "standard_only"):
        _fail("service_tier", "Input should be 'auto' or 'standard_only'")
    fields: dict[str, Any] = {
        "thinking": thinking.kind if thinking.kind in ("enabled", "adaptive") else None,
        "thinking_budget": thinking.budget,
        "temperature": number_param(body, "temperature", 0.0, 1.0),
        "top_p": number_param(body, "top_p", 0.0, 1.0),
        "top_k": top_k,
        "stop_sequences": tuple(_str(x, "stop_sequences") for x in _list(stops, "stop_sequences")),
        "tool_choice": tool_choice_param(body.get("tool_choice")),
        "service_tier": tier,
    }
    # built unchecked: a combination the API refuses is reported by ``validate``
    return ModelSettings.model_construct(**fields)


def parse_body(raw: bytes, *, count_tokens: bool = False) -> WireRequest:
    """Parse a ``/v1/messages`` (or ``/count_tokens``) body; raise ``APIFailure`` on bad shape."""
    try:
        decoded = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIFailure.invalid(f"There was an issue with your request body: {exc}") from None
    body = _dict(decoded, "body")
    _no_extra(body, _COUNT_FIELDS if count_tokens else _MESSAGE_FIELDS, "")
    model = _str(_required(body, "model", ""), "model")
    max_tokens = 4096
    if not count_tokens:
        max_tokens = _required(body, "max_tokens", "")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            _fail("max_tokens", "Input should be a valid integer")
        if max_tokens < 0:
            _fail("max_tokens", "Input should be greater than or equal to 0")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        _fail("stream", "Input should be a valid boolean")
    if stream and max_tokens == 0:
        _fail("max_tokens", "must be greater than 0 when streaming")
    marks: dict[BlockRef, CacheTTL] = {}
    tools = _tools(body.get("tools"), marks)
    system = _system(body.get("system"), marks)
    messages, breakpoints = _messages(_required(body, "messages", ""), marks)
    count = len(marks)
    automatic = body.get("cache_control")
    if automatic is not None:
        ttl = _cache_ttl(body, "")
        count += 1
        last = len(messages) - 1
        if ttl is not None and last >= 0 and messages[last].content:
            ref: BlockRef = ("message", last, len(messages[last].content) - 1)
            marks.setdefault(ref, ttl)
            if not breakpoints or breakpoints[-1][0] != last:
                breakpoints = (*breakpoints, (last, ttl))
    thinking = thinking_param(body.get("thinking"))
    settings = _settings(body, thinking)
    if thinking.kind is None and thinking_always_on(model):
        # these models think whenever ``thinking`` is absent: adaptive is their default
        settings = settings.model_copy(update={"thinking": "adaptive"})
    request = ModelRequest(
        model=model,
        system=system,
        tools=tools,
        messages=messages,
        max_tokens=max_tokens,
        message_breakpoints=breakpoints,
    ).model_copy(update={"settings": settings})  # unchecked: ``validate`` reports
    salt = canonical_json([body.get("tool_choice"), body.get("thinking")])
    asked, previous = diagnostics_param(body.get("diagnostics"))
    compaction, instructions = compaction_param(body.get("compaction"))
    return WireRequest(
        request=request,
        stream=stream,
        cache_marks=marks,
        breakpoint_count=count,
        salt=salt,
        diagnostics=asked,
        previous_message_id=previous,
        thinking_type=thinking.kind,
        compaction=compaction and not count_tokens,
        compaction_instructions=instructions,
        context_management=body.get("context_management") is not None,
        drop_mismatched_thinking=thinking.drop_mismatched,
    )


# -- responses ---------------------------------------------------------------------------
