"""What a compaction reads from the range it replaces: originals, handles, earlier summary."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from anabranch.context._budget import is_cleared, spill_handle
from anabranch.context._compaction import is_compaction_message
from anabranch.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock
from anabranch.runtime._context_view import ContextStore

__all__ = ["context_text", "handles_in", "originals", "previous_summary"]

_HANDLE = re.compile(r"recall id=(out_\w+)")


async def originals(
    store: ContextStore,
    run_id: str,
    head: tuple[Message, ...],
    pending: Mapping[str, str] | None = None,
) -> tuple[Message, ...]:
    """``head`` with every cleared tool result replaced by its original: from a spill not
    yet committed (``pending``, by handle), else from the store."""
    out: list[Message] = []
    for message in head:
        blocks = list(message.content)
        changed = False
        for index, block in enumerate(blocks):
            if isinstance(block, ToolResultBlock) and is_cleared(block):
                handle = spill_handle(run_id, block.tool_use_id)
                content = (pending or {}).get(handle)
                if content is None:
                    spill = await store.get_spill_record(handle)
                    content = spill.content if spill is not None else None
                if content is not None:
                    blocks[index] = block.model_copy(update={"content": content})
                    changed = True
        out.append(message.model_copy(update={"content": tuple(blocks)}) if changed else message)
    return tuple(out)


def handles_in(messages: tuple[Message, ...]) -> list[str]:
    """Recall handles named in ``messages`` (previews, stubs, elided results)."""
    found: dict[str, None] = {}
    for message in messages:
        for block in message.content:
            text = block.content if isinstance(block, ToolResultBlock) else None
            if isinstance(block, TextBlock):
                text = block.text
            if text:
                found.update(dict.fromkeys(_HANDLE.findall(text)))
    return list(found)


def previous_summary(head: tuple[Message, ...]) -> str:
    """The text of an earlier compaction opening at the start of ``head``, if any."""
    if head and is_compaction_message(head[0]):
        return head[0].text
    return ""


def context_text(messages: tuple[Message, ...]) -> str:
    parts = []
    for message in messages:
        for block in message.content:
            if isinstance(block, TextBlock):
                parts.append(block.text)
            elif isinstance(block, ToolResultBlock):
                parts.append(block.content)
            elif isinstance(block, ToolUseBlock):
                parts.append(json.dumps(block.input))
    return "\n".join(parts)
