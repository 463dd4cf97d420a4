"""Token accounting without a tokenizer: provider usage as the anchor, chars/4 for the rest."""

from __future__ import annotations

from collections.abc import Iterable

from anabranch._memo import IdentityMemo
from anabranch.context._content import message_attachment_tokens
from anabranch.messages import (
    Message,
    ModelRequest,
    SystemBlock,
    ToolDefinition,
    canonical_json,
)

__all__ = [
    "CHARS_PER_TOKEN",
    "SAFETY_FACTOR",
    "estimate_messages",
    "estimate_request",
    "message_tokens",
]

CHARS_PER_TOKEN = 4.0
SAFETY_FACTOR = 1.1
"""Estimates err high: compacting a little early is cheap, a prompt-too-long is not."""


def _estimate_chars(chars: int) -> int:
    return int(chars / CHARS_PER_TOKEN * SAFETY_FACTOR) + 1 if chars else 0


_TOKENS = "_anabranch_tokens"
_TOKENS_OF = "_anabranch_tokens_of"
"""A message's estimate, kept in its ``__dict__`` with the content it was made from (as
``messages`` keeps its JSON): a run estimates the same messages again at every call."""


def message_tokens(message: Message) -> int:
    """Estimated tokens of one message (see ``estimate_messages``), computed once per
    message object."""
    cached = message.__dict__
    if _TOKENS_OF in cached and cached[_TOKENS_OF] is message.content:
        kept: int = cached[_TOKENS]
        return kept
    tokens = _estimate_chars(message.char_count()) + 4 + message_attachment_tokens(message)
    cached[_TOKENS] = tokens
    cached[_TOKENS_OF] = message.content
    return tokens


def estimate_messages(messages: Iterable[Message]) -> int:
    """Estimated tokens of ``messages``: about 4 characters a token plus a margin, and a
    fixed or per-page cost for each image and document (see ``context._content``)."""
    return sum(map(message_tokens, messages))


def estimate_request(request: ModelRequest) -> int:
    """Estimated prompt tokens of a whole request: tools, system and messages."""
    chars = _PROMPT_CHARS.get((request.system, request.tools), _prompt_chars)
    return _estimate_chars(chars) + estimate_messages(request.messages)


_PROMPT_CHARS: IdentityMemo[int] = IdentityMemo()
"""Characters of a prompt's system blocks and tool definitions, by the (immutable) blocks:
a run's requests share its snapshot's."""


def _prompt_chars(system: tuple[SystemBlock, ...], tools: tuple[ToolDefinition, ...]) -> int:
    chars = sum(len(b.text) for b in system)
    return chars + sum(
        len(t.name) + len(t.description) + len(canonical_json(t.input_schema)) for t in tools
    )
