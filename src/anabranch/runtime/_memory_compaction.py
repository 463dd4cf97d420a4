"""Memory around a compaction: extract durable facts from the range before it is
summarized, and choose relevant memories again for the compacted context.

Both are steps the compactor calls with a narrow view of the run (``MemoryRun``) and a
function that sends one model request; both return values (details for the boundary row,
the rebuilt context) and never fail a compaction: a failed extraction or selection is
recorded on its span and the boundary, and the compaction goes on without it.

The re-selected memories are one more text block at the end of the compacted context's
opening user turn, after the summary (never the system prompt): the opening is a derived
row committed with the boundary, so a resumed run sends the same bytes.
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

import anyio.to_thread

from anabranch.agents import Agent
from anabranch.context._compaction import Rebuilt
from anabranch.context._transcript import chars_for_tokens, transcript_parts
from anabranch.errors import ModelError
from anabranch.memory._extract import (
    ExtractedMemory,
    extracted_upto,
    extraction_request,
    parse_extraction,
    save_extraction,
)
from anabranch.memory._files import MemoryFile, Provenance
from anabranch.memory._index import capped_index
from anabranch.messages import Message, ModelRequest, ModelResponse, TextBlock
from anabranch.runtime._history import boundary_extra
from anabranch.runtime._memory import choose_memories, memory_folder, render_attachment
from anabranch.store import BoundaryRecord
from anabranch.traces import Tracing

__all__ = [
    "CompactionMemory",
    "MemoryRun",
    "extract_before_compaction",
    "reselect_after_compaction",
    "surfaced_names",
]

_log = logging.getLogger(__name__)

Call = Callable[[ModelRequest], Awaitable[ModelResponse]]
_SURFACED = re.compile(r'<memory name="([^"]+)"')
_QUERY_CHARS = 4_000
"""How much of the summary and the latest turn a re-selection reads."""


class _Boundaries(Protocol):
    async def list_boundaries(
        self, *, run_id: str | None = None, session_id: str | None = None
    ) -> list[BoundaryRecord]: ...


class MemoryRun(Protocol):
    """What these steps read of a run."""

    @property
    def id(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def agent(self) -> Agent: ...
    @property
    def tracing(self) -> Tracing: ...
    @property
    def store(self) -> _Boundaries: ...


# ---------------------------------------------------------------------- extraction
def _extract_model(agent: Agent) -> str:
    memory = agent.memory
    assert memory is not None
    return memory.extract_model or agent.context.summarizer_model or agent.model


async def extract_before_compaction(
    run: MemoryRun,
    head: Sequence[Message],
    seqs: Sequence[int | None],
    *,
    window: int,
    call: Call,
) -> dict[str, Any]:
    """Save the durable facts of ``head`` (the range about to be summarized) as memories.

    Only stored messages (``seqs`` not ``None``) after what this run already extracted are
    read, so a compaction redone after a crash asks nothing again. Returns what it did, for
    the boundary's ``extra`` (empty when the option is off).
    """
    agent = run.agent
    memory = agent.memory
    if memory is None or memory.read_only or not memory.extract_before_compaction:
        return {}
    folder = memory_folder(agent)
    upto = await anyio.to_thread.run_sync(extracted_upto, folder, run.id)
    picked = [
        (message, seq)
        for message, seq in zip(head, seqs, strict=True)
        if seq is not None and (upto is None or seq > upto)
    ]
    with run.tracing.memory_span("extract", agent=agent.name, session_id=run.session_id) as span:
        if not picked:
            result: dict[str, Any] = {"skipped": "already extracted", "upto": upto}
            run.tracing.memory_result(span, result)
            return {"memory_extraction": result}
        first, last = picked[0][1], picked[-1][1]
        assert first is not None and last is not None
        index = await anyio.to_thread.run_sync(folder.index_text) or ""
        index = capped_index(
            index,
            max_lines=memory.index_max_lines,
            max_bytes=min(memory.index_max_bytes, chars_for_tokens(window // 5)),
        ).text
        max_tokens = min(2048, max(256, window // 4))
        part_chars = chars_for_tokens(max(512, window * 3 // 5 - max_tokens))
        parts = transcript_parts(
            [m for m, _ in picked], part_chars, [f"msg-{s}" for _, s in picked]
        )
        found: list[ExtractedMemory] = []
        failure: str | None = None
        model = _extract_model(agent)
        for part in parts:
            request = extraction_request(
                model=model,
                transcript=part,
                index=index,
                first=first,
                last=last,
                max_tokens=max_tokens,
            )
            try:
                found += parse_extraction(await call(request))
            except (ModelError, ValueError) as exc:
                failure = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
                _log.info("memory extraction for %s failed: %s", agent.name, failure)
                break
        source = Provenance(
            session_id=run.session_id, run_id=run.id, message_seq=last, message_range=(first, last)
        )
        try:
            outcome = await anyio.to_thread.run_sync(save_extraction, folder, found, source)
        except OSError as exc:
            failure = f"the memory folder cannot be written ({exc})"
            saved, refused = [], len(found)
        else:
            saved, refused = outcome.saved, len(outcome.refused)
            for name, why in outcome.refused:
                _log.info("extracted memory %r not saved: %s", name, why)
        result = {
            "range": f"{first}-{last}",
            "messages": len(picked),
            "requests": len(parts),
            "model": model,
            "saved": saved,
            "refused": refused,
        }
        if failure is not None:
            result["failure"] = failure
        run.tracing.memory_result(span, result)
    return {"memory_extraction": result}


# ---------------------------------------------------------------------- re-selection
def surfaced_names(messages: Iterable[Message]) -> set[str]:
    """Memory names already attached to these messages (``<relevant_memories>`` blocks)."""
    names: set[str] = set()
    for message in messages:
        if message.role != "user":
            continue
        for block in message.content:
            if isinstance(block, TextBlock) and block.text.startswith("<relevant_memories>"):
                names.update(html.unescape(n) for n in _SURFACED.findall(block.text))
    return names


async def _surfaced_before(run: MemoryRun) -> set[str]:
    names: set[str] = set()
    for boundary in await run.store.list_boundaries(run_id=run.id):
        listed = boundary_extra(boundary).get("memories_surfaced")
        if isinstance(listed, list):
            names.update(n for n in listed if isinstance(n, str))
    return names


def _query(rebuilt: Sequence[Message]) -> str:
    """What the compacted context is about: its opening (the summary) and latest user turn."""
    opening = rebuilt[0].text if rebuilt else ""
    latest = next((m.text for m in reversed(rebuilt[1:]) if m.role == "user"), "")
    return (opening[: _QUERY_CHARS // 2] + "\n\n" + latest[-_QUERY_CHARS // 2 :]).strip()


def _fitting(memories: Sequence[MemoryFile], max_chars: int) -> list[MemoryFile]:
    kept: list[MemoryFile] = []
    for memory in memories:
        if len(render_attachment([*kept, memory])) > max_chars:
            break
        kept.append(memory)
    return kept


async def reselect_after_compaction(
    run: MemoryRun,
    head: Sequence[Message],
    rebuilt: Rebuilt,
    *,
    max_chars: int,
    call: Call,
) -> tuple[Rebuilt, dict[str, Any]]:
    """``rebuilt`` with relevant memories not yet surfaced in the run attached after the
    summary (at most ``max_chars`` of them), and the details for the boundary."""
    agent = run.agent
    memory = agent.memory
    messages = rebuilt.messages
    if (
        memory is None
        or memory.select == 0
        or not memory.reselect_after_compaction
        or not messages
        or messages[0].role != "user"
    ):
        return rebuilt, {}
    surfaced = await _surfaced_before(run) | surfaced_names(head) | surfaced_names(messages)
    folder = memory_folder(agent)
    everything = await anyio.to_thread.run_sync(folder.all)
    candidates = [m for m in everything if m.name not in surfaced][: memory.select_candidates]
    chosen: list[str] = []
    if candidates:
        with run.tracing.memory_span("select", agent=agent.name, session_id=run.session_id) as span:
            chosen, method = await choose_memories(call, memory, _query(messages), candidates)
            by_name = {m.name: m for m in candidates}
            fitting = _fitting([by_name[n] for n in chosen], max_chars)
            run.tracing.memory_result(
                span,
                {
                    "after_compaction": True,
                    "considered": len(candidates),
                    "considered_names": [m.name for m in candidates],
                    "skipped_surfaced": sorted(surfaced),
                    "chosen": [m.name for m in fitting],
                    "method": method,
                },
            )
        chosen = [m.name for m in fitting]
        if fitting:
            opening = messages[0]
            attachment = TextBlock(text=render_attachment(fitting))
            opening = Message(role="user", content=(*opening.content, attachment))
            rebuilt = Rebuilt(
                (opening, *messages[1:]), rebuilt.sources, rebuilt.kept, rebuilt.spills
            )
    return rebuilt, {"memories_surfaced": sorted({*surfaced, *chosen})}


class CompactionMemory:
    """Both steps for one compaction attempt of ``run`` (what the compactor calls)."""

    def __init__(self, run: MemoryRun, call: Call, window: int) -> None:
        self.run = run
        self.call = call
        self.window = window

    async def extract(self, head: Sequence[Message], seqs: Sequence[int | None]) -> dict[str, Any]:
        return await extract_before_compaction(
            self.run, head, seqs, window=self.window, call=self.call
        )

    async def reselect(
        self, head: Sequence[Message], rebuilt: Rebuilt, max_chars: int, details: dict[str, Any]
    ) -> Rebuilt:
        """``rebuilt`` with memories attached; what was surfaced goes into ``details``."""
        rebuilt, surfaced = await reselect_after_compaction(
            self.run, head, rebuilt, max_chars=max_chars, call=self.call
        )
        details.update(surfaced)
        return rebuilt
