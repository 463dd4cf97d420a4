"""What a compaction reads from the range it replaces: originals, handles, earlier summary."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from anabranch.context._budget import is_cleared, spill_handle
from anabranch.context._compaction import is_compaction_message
from anabranch.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock

if TYPE_CHECKING:
    from anabranch.runtime._loop import AgentRun

__all__ = ["context_text", "handles_in", "originals", "previous_summary"]

_HANDLE = re.compile(r"recall id=(out_\w+)")


async def originals(run: AgentRun, head: tuple[Message, ...]) -> tuple[Message, ...]:
    """``head`` with every cleared tool result replaced by its original (from its spill)."""
    store = run.env.store
    out: list[Message] = []
    for message in head:
        blocks = list(message.content)
        changed = False
        for index, block in enumerate(blocks):
            if isinstance(block, ToolResultBlock) and is_cleared(block):
                spill = await store.get_spill_record(spill_handle(run.id, block.tool_use_id))
                if spill is not None:
                    blocks[index] = block.model_copy(update={"content": spill.content})
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
