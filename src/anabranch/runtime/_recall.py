"""The built-in ``recall`` tool: nothing that left an agent's context is out of its reach.

``recall(id=...)`` returns the original text behind a handle (a spilled or cleared tool
output ``out_…``, a sub-agent's full report, or ``msg-N`` from a search), page by page;
``recall(query=...)`` searches the run's own history (SQLite FTS5 over every original
message and spilled output, compacted or not).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from anabranch.agents import Agent
from anabranch.context._budget import word_cut
from anabranch.context._content import (
    attachment_note,
    attachments_from_json,
    attachments_handle,
)
from anabranch.messages import (
    Document,
    Image,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)
from anabranch.runtime._builtins import ToolOutcome
from anabranch.runtime._history import load_messages
from anabranch.runtime._view import RunView
from anabranch.store import HistoryHit, Store

__all__ = ["RecallTool"]

RECALL = "recall"
_MESSAGE_ID = re.compile(r"^msg-(\d+)$")
_PAGE_NOTE_ROOM = 200

DESCRIPTION = (
    "Get back text that is no longer in your context, or search your own history. "
    "Pass `id` to read the original behind a handle: `out_...` from a note such as "
    "'recall id=out_...' (a truncated, cleared or elided tool output, or a full report), "
    "or `msg-N` from a search result. Long texts come in pages: pass the `offset` the "
    "previous page names. Pass `query` (a few words) to search every earlier message and "
    "tool output of this run, including those compacted away."
)


PREVENTIVE_NOTE = (
    "Your context is kept within its window automatically: old tool results may be "
    "cleared, and older turns replaced by a summary. When a result holds something you "
    "will need later (an id, a number, a path, a decision), write it down in your reply "
    "as you go. Nothing is deleted: the recall tool brings back any earlier message or "
    "output by its id, or finds it by a few words."
)


class RecallArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(None, description="A handle: out_... or msg-N.")
    query: str | None = Field(None, description="Words to search for in your own history.")
    offset: int = Field(0, ge=0, description="With id: the character to start reading at.")
    limit: int = Field(5, ge=1, le=20, description="With query: the most matches to list.")


@functools.cache
def _schema() -> dict[str, Any]:
    """The arguments' JSON schema, built once (pydantic takes about a millisecond per call,
    and every agent run asks for it)."""
    schema: dict[str, Any] = RecallArguments.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema


def _render(message: Message) -> str:
    parts = [f"({message.role})"]
    for block in message.content:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            parts.append(f"[tool call {block.name} id={block.id}] {json.dumps(block.input)}")
        elif isinstance(block, ToolResultBlock):
            error = " error" if block.is_error else ""
            parts.append(f"[tool result id={block.tool_use_id}{error}]\n{block.content}")
            parts.extend(attachment_note(a) for a in block.attachments)
        elif isinstance(block, Image | Document):
            parts.append(attachment_note(block))
        elif isinstance(block, ThinkingBlock):
            parts.append(f"[thinking] {block.thinking}")
    return "\n".join(parts)


class RecallTool:
    """``recall``: fetch an original by handle, or search the run's own history."""

    name = RECALL
    clearable = True
    """What recall returned can be recalled again: cleared first when room is needed."""

    def applies_to(self, agent: Agent) -> bool:
        return True

    def guidance(self, agent: Agent) -> str:
        """The preventive note of the static prompt (``ContextPolicy.preventive_notes``)."""
        if not agent.context.preventive_notes:
            return ""
        return PREVENTIVE_NOTE

    def definition(self, agent: Agent) -> ToolDefinition:
        return ToolDefinition(name=self.name, description=DESCRIPTION, input_schema=_schema())

    async def run(self, run: RunView, call: ToolUseBlock) -> ToolOutcome:
        try:
            args = RecallArguments.model_validate(call.input)
        except pydantic.ValidationError as exc:
            problems = "; ".join(e["msg"] for e in exc.errors())
            return ToolOutcome(f"Invalid arguments for recall: {problems}", is_error=True)
        if args.id:
            return await self._fetch(run, args.id.strip(), args.offset)
        if args.query and args.query.strip():
            return await self._search(run, args.query, args.limit)
        return ToolOutcome("Pass `id` (a handle) or `query` (words to search).", is_error=True)

    async def _fetch(self, run: RunView, handle: str, offset: int) -> ToolOutcome:
        store = run.store
        text: str | None = None
        attachments: tuple[Image | Document, ...] = ()
        match = _MESSAGE_ID.match(handle)
        if match:
            seq = int(match.group(1))
            records, messages = await load_messages(store, run.id, from_seq=seq, to_seq=seq)
            if records and records[0].kind == "message":
                message = messages[0]
                text = _render(message)
                attachments = tuple(message.attachments)
        else:
            spill = await store.get_spill_record(handle)
            if spill is not None:
                owner = await store.get_run(spill.run_id)
                if owner is not None and owner.session_id == run.session_id:
                    text = spill.content
                    extra = await store.get_spill(attachments_handle(handle))
                    attachments = attachments_from_json(extra) if extra else ()
        if text is None:
            return ToolOutcome(f"Nothing is stored under id {handle!r} for this run.", True)
        page = max(1, run.agent.context.spill_chars - _PAGE_NOTE_ROOM)
        if offset >= len(text) and text:
            return ToolOutcome(f"id {handle} has {len(text):,} characters; offset is past the end.")
        chunk = text[offset : offset + word_cut(text[offset:], page)]
        end = offset + len(chunk)
        if end < len(text):
            chunk += f"\n[{len(text) - end:,} more characters: recall id={handle} offset={end}]"
        return ToolOutcome(chunk, attachments=attachments if offset == 0 else ())

    async def _search(self, run: RunView, query: str, limit: int) -> ToolOutcome:
        """Search the run's history, leaving out the current turn and recall's own calls
        and results; best matches first; any word when no hit has them all."""
        words = [w.lower() for w in re.findall(r"\w+", query)]
        if not words:
            return ToolOutcome(f"No match for {query!r} in this run's history.")
        store = run.store
        wanted = limit * 4 + 8
        ranked = await self._useful(run, await store.search_history(run.id, query, wanted))
        if not ranked and len(words) > 1:  # nothing useful has every word: rank by any word
            ranked = await self._any_word(run, list(dict.fromkeys(words)), wanted)
        ranked = ranked[:limit]
        if not ranked:
            return ToolOutcome(f"No match for {query!r} in this run's history.")
        lines = [f"{len(ranked)} match(es) for {query!r} in this run's history:"]
        for hit in ranked:
            ref = f"msg-{hit.ref}" if hit.source == "message" else hit.ref
            kind = "message" if hit.source == "message" else "tool output"
            snippet = " ".join(hit.snippet.split())
            lines.append(f"- id={ref} ({kind}): {snippet}")
        lines.append("Read one in full with recall(id=...).")
        return ToolOutcome("\n".join(lines))

    async def _any_word(self, run: RunView, words: list[str], wanted: int) -> list[HistoryHit]:
        """Hits of any word, those matching the most words first, rarer words first; each
        with the snippet of its rarest matching word."""
        found = [(word, await run.store.search_history(run.id, word, wanted)) for word in words]
        found.sort(key=lambda pair: len(pair[1]))
        best: dict[tuple[str, str], tuple[HistoryHit, int]] = {}
        matched: dict[tuple[str, str], int] = {}
        for rarity, (_, hits) in enumerate(found):
            for hit in hits:
                key = (hit.source, hit.ref)
                best.setdefault(key, (hit, rarity))
                matched[key] = matched.get(key, 0) + 1
        order = sorted(best, key=lambda key: (-matched[key], best[key][1]))
        return await self._useful(run, [best[key][0] for key in order])

    async def _useful(self, run: RunView, hits: list[HistoryHit]) -> list[HistoryHit]:
        """``hits`` without the current turn and without recall's own calls and results."""
        current = run.next_seq - 1 if run.context and run.context[-1].role == "assistant" else None
        store = run.store
        kept: list[HistoryHit] = []
        for hit in hits:
            if hit.source != "message":
                kept.append(hit)
                continue
            seq = int(hit.ref)
            if current is not None and seq >= current:
                continue
            if not await _only_recall(store, run.id, seq):
                kept.append(hit)
        return kept


async def _only_recall(store: Store, run_id: str, seq: int) -> bool:
    """Whether stored message ``seq`` holds nothing but recall calls or recall results."""
    records, messages = await load_messages(store, run_id, from_seq=max(0, seq - 1), to_seq=seq)
    by_seq = {r.seq: m for r, m in zip(records, messages, strict=True)}
    message = by_seq.get(seq)
    if message is None:
        return False
    if message.role == "assistant":
        return bool(message.tool_uses) and all(
            isinstance(b, ToolUseBlock) and b.name == RECALL for b in message.content
        )
    previous = by_seq.get(seq - 1)
    if previous is None or not message.tool_results:
        return False
    names = {u.id: u.name for u in previous.tool_uses}
    return all(
        isinstance(b, ToolResultBlock) and names.get(b.tool_use_id) == RECALL
        for b in message.content
    )
