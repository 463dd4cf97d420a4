"""Messages as plain text for a summarizer, cut into parts that fit its budget.

When the range to summarize does not fit the summarizer's window it is summarized in
parts, each request carrying the running summary (``context.compaction`` and
``runtime._summarizer``). Every character of the range goes into some part: a message
longer than a part is cut across parts, never left out.

Rendering is generic over block types: text, tool calls and tool results are written out;
any other block (thinking, image, document, ...) is written by ``render_block`` from what
it carries (its text, or a one-line placeholder naming its type for binary content).
"""

from __future__ import annotations

from collections.abc import Sequence

from anabranch.context._budget import word_cut
from anabranch.context._content import attachment_note
from anabranch.context._tokens import CHARS_PER_TOKEN, SAFETY_FACTOR
from anabranch.messages import (
    Block,
    Document,
    Image,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    canonical_json,
)

__all__ = ["chars_for_tokens", "render_block", "render_message", "transcript_parts"]


def chars_for_tokens(tokens: int) -> int:
    """About how many characters fit in ``tokens`` (the inverse of the token estimate)."""
    return max(0, int(tokens * CHARS_PER_TOKEN / SAFETY_FACTOR))


def render_block(block: Block) -> str:
    """One block as text (see the module docstring)."""
    if isinstance(block, TextBlock):
        return block.text
    if isinstance(block, ToolUseBlock):
        return f"[tool call {block.name} id={block.id}] {canonical_json(block.input)}"
    if isinstance(block, ToolResultBlock):
        error = " (error)" if block.is_error else ""
        notes = "".join("\n" + attachment_note(a) for a in block.attachments)
        return f"[tool result id={block.tool_use_id}{error}]\n{block.content}{notes}"
    if isinstance(block, Image | Document):
        return attachment_note(block)
    kind = str(getattr(block, "type", type(block).__name__))
    for name in ("thinking", "text", "content"):
        value = getattr(block, name, None)
        if isinstance(value, str) and value:
            return f"[{kind}]\n{value}"
    return f"[{kind} block]"


def render_message(message: Message, label: str | None = None) -> str:
    """A message as ``(role label)`` then its blocks, one per paragraph."""
    head = f"({message.role}{' ' + label if label else ''})"
    return "\n".join([head, *(render_block(b) for b in message.content)])


def transcript_parts(
    messages: Sequence[Message], part_chars: int, labels: Sequence[str | None] | None = None
) -> list[str]:
    """``messages`` rendered and packed into parts of at most ``part_chars`` characters.

    Messages are kept whole where they fit; a longer one is cut across parts (at a space
    where there is one, so no identifier is split). Joining the
    parts gives back every rendered message, in order.
    """
    if part_chars <= 0:
        raise ValueError("part_chars must be positive")
    parts: list[str] = []
    current = ""
    for index, message in enumerate(messages):
        label = labels[index] if labels is not None else None
        text = render_message(message, label) + "\n\n"
        if current and len(current) + len(text) > part_chars:
            parts.append(current)
            current = ""
        while len(current) + len(text) > part_chars:
            room = word_cut(text, part_chars - len(current))
            parts.append(current + text[:room])
            current, text = "", text[room:]
        current += text
    if current:
        parts.append(current)
    return parts
