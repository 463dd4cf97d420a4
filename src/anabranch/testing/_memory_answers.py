"""How ``TestModel`` answers the memory requests: the extraction before a compaction and
the model-written consolidation. Both force one tool (``tool_choice``), so the answer is
what the real API sends for them: a ``tool_use`` block of that tool, ``stop_reason``
``tool_use``, with an input that matches the tool's schema.

The choices are deterministic and simple, and only what a test needs offline:

- extraction: every sentence of a user turn that states a preference or a standing fact
  ("I prefer", "always", "never", "my ... is", "call me") becomes one ``user`` memory;
- consolidation: memories of one type whose names share their first word are merged into
  the newest of them, keeping every line; each day of logs becomes one ``project`` memory.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from anabranch.memory._consolidate_model import CONSOLIDATE_TOOL
from anabranch.memory._extract import EXTRACT_TOOL
from anabranch.messages import Block, ModelRequest, ToolUseBlock, canonical_json

__all__ = ["memory_answer"]

_HEADER = re.compile(r"^\((user|assistant)(?: [^)]*)?\)$")
_CUE = re.compile(
    r"\b(i prefer|i always|i never|always|never|my [a-z]+ is|call me|i am a|i'm a|"
    r"please remember)\b",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")
_SLUG = re.compile(r"[^a-z0-9]+")
_MAX = 3


def _slug(text: str, words: int = 5) -> str:
    return "-".join(_SLUG.sub(" ", text.lower()).split()[:words]) or "memory"


def _tool_use(request: ModelRequest, name: str, arguments: dict[str, Any]) -> ToolUseBlock:
    digest = hashlib.sha256(canonical_json([name, request.fingerprint()]).encode()).hexdigest()
    return ToolUseBlock(id=f"toolu_mem{digest[:20]}", name=name, input=arguments)


def _user_sentences(transcript: str) -> list[str]:
    found: list[str] = []
    role = ""
    for line in transcript.splitlines():
        header = _HEADER.match(line.strip())
        if header:
            role = header.group(1)
            continue
        if role != "user" or line.startswith("["):  # tool results are data
            continue
        for sentence in _SENTENCE.findall(line):
            text = " ".join(sentence.split())
            if _CUE.search(text) and text not in found:
                found.append(text)
    return found


def _extraction(request: ModelRequest) -> dict[str, Any]:
    transcript = request.messages[-1].text if request.messages else ""
    memories = [
        {
            "type": "user",
            "name": _slug(sentence),
            "description": sentence[:120],
            "content": sentence,
        }
        for sentence in _user_sentences(transcript)[:_MAX]
    ]
    return {"memories": memories}


def _consolidation(request: ModelRequest) -> dict[str, Any]:
    """Merge by the first word of the name within a type; one memory per day of logs."""
    payload = json.loads(request.messages[-1].text.partition("\n")[2] or "{}")
    memories: Sequence[dict[str, Any]] = payload.get("memories", [])
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for memory in memories:  # newest first
        key = (str(memory.get("type")), str(memory.get("name", "")).split("-")[0])
        groups.setdefault(key, []).append(memory)
    merges = []
    for group in groups.values():
        if len(group) < 2:
            continue
        newest = group[0]
        lines: list[str] = []
        for memory in group:
            lines += [ln for ln in str(memory.get("content", "")).splitlines() if ln not in lines]
        merges.append(
            {
                "names": [m["name"] for m in group],
                "name": newest["name"],
                "description": newest["description"],
                "type": newest["type"],
                "content": "\n".join(lines),
            }
        )
    distilled = []
    for day, entries in sorted(payload.get("logs", {}).items()):
        distilled.append(
            {
                "name": f"log-notes-{day}",
                "description": f"What was logged on {day}",
                "type": "project",
                "content": "\n".join(entries),
            }
        )
    return {"merges": merges, "distilled": distilled}


def memory_answer(request: ModelRequest) -> list[Block] | None:
    """The answer to a memory request, or ``None`` when ``request`` is not one."""
    choice = request.settings.tool_choice
    if choice not in (EXTRACT_TOOL, CONSOLIDATE_TOOL):
        return None
    if not any(t.name == choice for t in request.tools):
        return None
    if choice == EXTRACT_TOOL:
        return [_tool_use(request, EXTRACT_TOOL, _extraction(request))]
    return [_tool_use(request, CONSOLIDATE_TOOL, _consolidation(request))]
