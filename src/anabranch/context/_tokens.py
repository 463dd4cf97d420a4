"""Token accounting without a tokenizer: provider usage as the anchor, chars/4 for the rest."""

from __future__ import annotations

from collections.abc import Iterable

from anabranch.context._content import message_attachment_tokens
from anabranch.messages import Message, ModelRequest, canonical_json

__all__ = ["CHARS_PER_TOKEN", "SAFETY_FACTOR", "estimate_messages", "estimate_request"]

CHARS_PER_TOKEN = 4.0
SAFETY_FACTOR = 1.1
"""Estimates err high: compacting a little early is cheap, a prompt-too-long is not."""


def _estimate_chars(chars: int) -> int:
    return int(chars / CHARS_PER_TOKEN * SAFETY_FACTOR) + 1 if chars else 0


def estimate_messages(messages: Iterable[Message]) -> int:
    """Estimated tokens of ``messages``: about 4 characters a token plus a margin, and a
    fixed or per-page cost for each image and document (see ``context._content``)."""
    return sum(_estimate_chars(m.char_count()) + 4 + message_attachment_tokens(m) for m in messages)


def estimate_request(request: ModelRequest) -> int:
    """Estimated prompt tokens of a whole request: tools, system and messages."""
    chars = sum(len(b.text) for b in request.system)
    chars += sum(
        len(t.name) + len(t.description) + len(canonical_json(t.input_schema))
        for t in request.tools
    )
    return _estimate_chars(chars) + estimate_messages(request.messages)
