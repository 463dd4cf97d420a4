"""Rules for the content blocks beyond text: thinking, images and documents.

Pure helpers the token estimate, the compactor and the spans share:

- an image or a document is a unit: it is counted at a fixed cost (an image) or by its
  pages (a PDF), never split, and leaves the context only whole, as a one-line note;
- a thinking block is never edited: it stays byte for byte where it is, or leaves with a
  summarized range; ``leading_thinking_intact`` checks the turn that must start with it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import TypeAdapter

from anabranch.messages import (
    Attachment,
    Document,
    Image,
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

__all__ = [
    "DOCUMENT_PAGE_TOKENS",
    "IMAGE_TOKENS",
    "ATTACHMENTS_SUFFIX",
    "attachment_note",
    "attachments_from_json",
    "attachments_handle",
    "attachments_to_json",
    "content_violations",
    "attachment_tokens",
    "drop_thinking",
    "leading_thinking_intact",
    "message_attachment_tokens",
    "pdf_pages",
    "thinking_unchanged",
    "without_attachments",
]

IMAGE_TOKENS = 2_000
"""Estimated tokens of one image. The API bills about width x height / 750 after resizing
to at most ~1.15 megapixels (so ~1,600 at most on older models, more on the current ones);
a fixed, slightly high figure keeps the estimate safe without decoding the image."""
DOCUMENT_PAGE_TOKENS = 2_500
"""Estimated tokens of one PDF page (its text plus the page as an image)."""
URL_DOCUMENT_PAGES = 10
"""Pages assumed for a PDF given by URL (its size is unknown until the API fetches it)."""

_PAGE = re.compile(rb"/Type\s*/Page(?!s)")


def pdf_pages(data: bytes) -> int:
    """Pages of a PDF, counted from its page objects (at least 1)."""
    return max(1, len(_PAGE.findall(data)))


def attachment_tokens(block: Image | Document) -> int:
    """Estimated prompt tokens of one image or document."""
    if isinstance(block, Image):
        return IMAGE_TOKENS
    if block.text is not None:
        return 0  # plain text is counted with the message's characters
    if block.data is not None:
        return pdf_pages(block.data) * DOCUMENT_PAGE_TOKENS
    return URL_DOCUMENT_PAGES * DOCUMENT_PAGE_TOKENS


def message_attachment_tokens(message: Message) -> int:
    """Estimated tokens of every image and document in ``message`` (tool results too)."""
    for block in message.content:  # the usual message has none: told with no call
        if type(block) is ToolResultBlock:
            if block.attachments:
                break
        elif type(block) is not TextBlock and type(block) is not ToolUseBlock:
            break
    else:
        return 0
    attachments = message.attachments
    return sum(attachment_tokens(a) for a in attachments) if attachments else 0


def attachment_note(block: Image | Document, handle: str | None = None) -> str:
    """One line that stands for an image or document: its kind and size, never content."""
    if block.url is not None:
        what = f"{block.type} from {block.url}"
    else:
        what = f"{block.type} {block.media_type}, {block.size:,} bytes"
    if isinstance(block, Document) and block.title:
        what += f", {block.title!r}"
    suffix = f"; recall id={handle}" if handle else ""
    return f"[{what}{suffix}]"


def thinking_unchanged(before: Sequence[Message], after: Sequence[Message]) -> list[str]:
    """Every thinking block of ``after`` must appear, unchanged, in ``before``.

    Returns the problems (empty when none): a compaction may drop thinking blocks with the
    range it summarizes, never edit or invent one.
    """
    known = {b for m in before for b in m.thinking_blocks}
    problems = []
    for i, message in enumerate(after):
        for block in message.thinking_blocks:
            if block not in known:
                problems.append(f"messages.{i}: a thinking block was changed or invented")
    return problems


def leading_thinking_intact(messages: Sequence[Message]) -> bool:
    """With thinking on, the last assistant turn of an open tool loop starts with its
    thinking block: true when ``messages`` keep that rule (or it does not apply)."""
    index = next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "assistant"), None
    )
    if index is None or not messages[index].tool_uses:
        return True
    first = messages[index].content[0] if messages[index].content else None
    return isinstance(first, ThinkingBlock | RedactedThinkingBlock)


def content_violations(
    before: Sequence[Message], after: Sequence[Message], *, thinking: bool | str | None
) -> list[str]:
    """Why ``after`` (a compacted ``before``) breaks the thinking rules; empty when it
    does not: no thinking block edited or invented, and with thinking on the last
    assistant turn of an open tool loop still leads with its thinking."""
    problems = thinking_unchanged(before, after)
    if thinking and leading_thinking_intact(before) and not leading_thinking_intact(after):
        problems.append("the last tool-use turn no longer starts with its thinking block")
    return problems


def drop_thinking(messages: Sequence[Message]) -> list[Message]:
    """``messages`` without thinking blocks, for a request that does not think (e.g. a
    summarizer): earlier turns' thinking may be omitted, never altered. A turn that was
    only thinking keeps a short note so it is not empty."""
    out: list[Message] = []
    for message in messages:
        if not message.thinking_blocks:
            out.append(message)
            continue
        blocks = tuple(
            b for b in message.content if not isinstance(b, ThinkingBlock | RedactedThinkingBlock)
        )
        out.append(
            Message(role=message.role, content=blocks or (TextBlock(text="(thought only)"),))
        )
    return out


def without_attachments(result: ToolResultBlock, handle: str) -> ToolResultBlock:
    """``result`` with each image or document replaced by its note and recall handle."""
    if not result.attachments:
        return result
    notes = "\n".join(attachment_note(a, handle) for a in result.attachments)
    content = f"{result.content}\n{notes}" if result.content else notes
    return result.model_copy(update={"content": content, "attachments": ()})


ATTACHMENTS_SUFFIX = ".attachments"
"""A spilled result's images and documents are kept under its handle plus this suffix."""
_ATTACHMENT_LIST: TypeAdapter[list[Attachment]] = TypeAdapter(list[Attachment])


def attachments_handle(handle: str) -> str:
    return handle + ATTACHMENTS_SUFFIX


def attachments_to_json(attachments: Sequence[Image | Document]) -> str:
    return _ATTACHMENT_LIST.dump_json(list(attachments)).decode()


def attachments_from_json(text: str) -> tuple[Image | Document, ...]:
    return tuple(_ATTACHMENT_LIST.validate_json(text))
