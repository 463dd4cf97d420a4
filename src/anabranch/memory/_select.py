"""Which memories are relevant to a task: a cheap model's choice, or keyword overlap.

The keyword fallback is deterministic: it runs offline, when no selection model is set,
and whenever the model call fails or answers with something unusable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from anabranch.memory._files import MemoryFile

__all__ = ["Selection", "keyword_selection", "parse_model_choice", "selection_prompt"]

_WORD = re.compile(r"[a-z0-9][a-z0-9_-]{2,}")
_STOP = frozenset(
    "the and for with that this from into your you are was were will what which when where "
    "who how why can could should would about have has had not but all any each use using "
    "please task make more most some such than then them they their there these those".split()
)


@dataclass(frozen=True)
class Selection:
    considered: tuple[str, ...]
    chosen: tuple[str, ...]
    method: str
    """``model``, ``keywords``, or ``keywords (model failed: …)``."""


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def keyword_selection(task: str, candidates: Sequence[MemoryFile], limit: int) -> list[str]:
    """Names of up to ``limit`` candidates sharing the most words with the task.

    Name and description words count double (they are what a memory is about); ties go
    to the more recently updated memory (``candidates`` come newest first).
    """
    wanted = _words(task)
    scored: list[tuple[int, int, str]] = []
    for order, memory in enumerate(candidates):
        about = _words(memory.name.replace("-", " ")) | _words(memory.description)
        score = 2 * len(wanted & about) + len(wanted & _words(memory.content))
        if score > 0:
            scored.append((-score, order, memory.name))
    return [name for _, _, name in sorted(scored)[:limit]]


def selection_prompt(task: str, candidates: Sequence[MemoryFile], limit: int) -> str:
    listing = "\n".join(f"- {m.name} ({m.type}): {m.description}" for m in candidates)
    return (
        f"A task is about to start:\n<task>\n{task}\n</task>\n\n"
        f"These memories are available (name (type): description):\n{listing}\n\n"
        f"Which of them (at most {limit}) would clearly help with this task? Answer with a "
        'JSON array of names only, e.g. ["name-a", "name-b"], or [] if none would.'
    )


def parse_model_choice(text: str, candidates: Sequence[MemoryFile], limit: int) -> list[str]:
    """The names in the model's JSON answer that are real candidates (``ValueError`` if
    the answer holds no JSON array)."""
    start, end = text.find("["), text.rfind("]")
    if start < 0 or end < start:
        raise ValueError("no JSON array in the answer")
    names = json.loads(text[start : end + 1])
    if not isinstance(names, list):
        raise ValueError("the answer is not a list")
    known = {m.name for m in candidates}
    chosen: list[str] = []
    for name in names:
        if isinstance(name, str) and name in known and name not in chosen:
            chosen.append(name)
    return chosen[:limit]
