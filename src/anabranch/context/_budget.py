"""Tool-result budgets: previews of oversized results and one-line stubs for old ones.

Pure and deterministic: the same inputs always give the same text, because ingest runs
again on resume for results that are already stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from anabranch.messages import Document, Image, Message, ToolResultBlock

__all__ = [
    "ClearedResult",
    "clear_stub",
    "clear_tool_results",
    "is_cleared",
    "preview",
    "spill_handle",
    "word_cut",
]

_STUB_PREFIX = "[tool result cleared"


def spill_handle(run_id: str, call_id: str) -> str:
    """The recall handle of one tool call's full output (stable: derived from both ids)."""
    digest = hashlib.sha256(f"{run_id}\x00{call_id}".encode()).hexdigest()[:16]
    return f"out_{digest}"


def word_cut(text: str, limit: int) -> int:
    """Where to cut ``text`` at most ``limit`` characters in: the last whitespace in the
    final fifth of that span, so an identifier is not split in two (else ``limit``)."""
    if limit >= len(text):
        return len(text)
    floor = limit - limit // 5
    space = max(text.rfind(" ", floor, limit), text.rfind("\n", floor, limit))
    return space + 1 if space > 0 else limit


def preview(
    content: str, *, is_error: bool, max_chars: int, preview_chars: int, handle: str
) -> str | None:
    """The inline version of a result longer than ``max_chars``; ``None`` if it fits.

    A normal result keeps its head; an error keeps head and tail (the cause is often last).
    Both end with the handle that recalls the full text.
    """
    if len(content) <= max_chars:
        return None
    keep = max(0, min(preview_chars, max_chars))
    total = len(content)
    if not is_error:
        keep = word_cut(content, keep)
        note = (
            f"[output truncated: showing the first {keep:,} of {total:,} characters; "
            f"full output: recall id={handle}]"
        )
        return f"{content[:keep]}\n{note}" if keep else note
    head, tail = keep - keep // 2, keep // 2
    note = (
        f"[error output truncated: {total - head - tail:,} of {total:,} characters omitted; "
        f"full output: recall id={handle}]"
    )
    parts = [content[:head], note, content[total - tail :] if tail else ""]
    return "\n".join(p for p in parts if p)


def clear_stub(name: str, result: ToolResultBlock, handle: str) -> str:
    """The one line that replaces an old tool result in the context (its images and
    documents are named by kind and size: they leave whole, and come back with recall)."""
    kind = "error, " if result.is_error else ""
    extra = "".join(
        f", {a.type} {a.media_type or 'url'} {a.size:,} bytes" for a in result.attachments
    )
    return (
        f"{_STUB_PREFIX}: {name}, {kind}{len(result.content):,} characters{extra}; "
        f"recall id={handle}]"
    )


def is_cleared(result: ToolResultBlock) -> bool:
    return result.content.startswith(_STUB_PREFIX)


@dataclass(frozen=True)
class ClearedResult:
    """A tool result replaced by a stub: what to spill under which handle."""

    call_id: str
    handle: str
    content: str
    attachments: tuple[Image | Document, ...] = ()
    """Images and documents that left with the result (spilled with it, recallable)."""


def clear_tool_results(
    messages: Sequence[Message],
    *,
    keep_last: int,
    run_id: str,
    clearable: Callable[[str], bool] | None = None,
) -> tuple[list[Message], list[ClearedResult]]:
    """Replace every tool result but the last ``keep_last`` by a stub with its recall handle.

    Results that are already stubs, results no longer than their stub, and results of a
    tool that ``clearable(tool_name)`` says may not be cleared stay as they are (the last
    ``keep_last`` are counted over every result). Message structure (roles, blocks, tool
    ids) never changes, so pairing is untouched.
    """
    names = {use.id: use.name for m in messages for use in m.tool_uses}
    positions = [
        (i, j)
        for i, m in enumerate(messages)
        for j, b in enumerate(m.content)
        if isinstance(b, ToolResultBlock)
    ]
    targets = set(positions[: max(0, len(positions) - keep_last)])
    cleared: list[ClearedResult] = []
    result: list[Message] = []
    for i, message in enumerate(messages):
        blocks = list(message.content)
        changed = False
        for j, block in enumerate(blocks):
            if (i, j) not in targets or not isinstance(block, ToolResultBlock):
                continue
            if is_cleared(block):
                continue
            name = names.get(block.tool_use_id, "tool")
            if clearable is not None and not clearable(name):
                continue
            handle = spill_handle(run_id, block.tool_use_id)
            stub = clear_stub(name, block, handle)
            if len(stub) >= len(block.content) and not block.attachments:
                continue
            blocks[j] = block.model_copy(update={"content": stub, "attachments": ()})
            cleared.append(
                ClearedResult(block.tool_use_id, handle, block.content, block.attachments)
            )
            changed = True
        result.append(message.model_copy(update={"content": tuple(blocks)}) if changed else message)
    return result, cleared
