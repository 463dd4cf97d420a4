"""What a compaction removed, and what of it its summary kept: the loss manifest.

Deterministic and model-free. ``salient_terms`` picks the strings later work most often
depends on and summaries most often lose: identifiers (with a digit, an underscore or a
dash inside), numbers, paths and URLs, and commands (a backquoted span or a line starting
with ``$``). ``manifest`` compares the removed range with what replaces it:

- ``missing``: salient terms of the range that the replacement does not contain;
- ``inferred``: summary lines that hold a salient term found neither in the range nor in
  the previous summary (the summarizer's own inference, not a fact it was shown).

``dropped_note`` is what the ``window`` strategy (and any fallback that drops messages
without a summarizer) leaves in their place: the message handles, the tool calls and
their recall handles, and the digest of salient terms, so nothing leaves silently.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from anabranch.context._transcript import render_message
from anabranch.messages import Message

__all__ = [
    "Manifest",
    "dropped_note",
    "handle_ranges",
    "handles_line",
    "manifest",
    "named_seqs",
    "salient_terms",
]

_PATH = re.compile(r"(?:[A-Za-z]+://\S+|(?:\.{0,2}/)?(?:[\w.-]+/)+[\w.-]+)")
_COMMAND = re.compile(r"`([^`\n]{2,200})`|^\s*\$ (.{2,200})$", re.MULTILINE)
_NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,:]\d+)*(?![\w])")
_IDENT = re.compile(r"\b[A-Za-z_][\w-]*(?:\d|_|-)[\w-]*\b")
_MAX_TERMS = 400
_MAX_NOTE_TERMS = 120


def salient_terms(text: str) -> list[str]:
    """Identifiers, numbers, paths and commands in ``text``, first occurrence order."""
    found: dict[str, None] = {}
    for match in _COMMAND.finditer(text):
        found[(match.group(1) or match.group(2)).strip()] = None
    for pattern in (_PATH, _IDENT, _NUMBER):
        for term in pattern.findall(text):
            term = term.rstrip(".,;:")
            if len(term) >= 2 or term.isdigit():
                found[term] = None
    return list(found)[:_MAX_TERMS]


_MSG_RANGE = re.compile(r"msg-(\d+)(?:\.\.msg-(\d+))?")


def named_seqs(text: str) -> list[int]:
    """The message seqs a text names as ``msg-N`` or ``msg-a..msg-b`` (an earlier note)."""
    seqs: list[int] = []
    for first, last in _MSG_RANGE.findall(text):
        seqs.extend(range(int(first), int(last or first) + 1))
    return seqs


def handle_ranges(seqs: Iterable[int]) -> list[str]:
    """``msg-N`` handles of stored messages, runs collapsed as ``msg-3..msg-9``."""
    ordered = sorted(set(seqs))
    out: list[str] = []
    start = prev = None
    for seq in [*ordered, None]:
        if seq is not None and prev is not None and seq == prev + 1:
            prev = seq
            continue
        if start is not None and prev is not None:
            out.append(f"msg-{start}" if start == prev else f"msg-{start}..msg-{prev}")
        start = prev = seq
    return out


@dataclass(frozen=True)
class Manifest:
    """The loss manifest of one compaction boundary (see the module docstring)."""

    removed_messages: tuple[int, ...] = ()
    """Stored seqs of the messages that left the context."""
    tool_calls: tuple[str, ...] = ()
    """Tool call ids whose call or result left the context."""
    handles: tuple[str, ...] = ()
    """Recall handles of the outputs that left the context."""
    missing: tuple[str, ...] = ()
    inferred: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, list[str] | list[int]]:
        return {
            "removed_messages": list(self.removed_messages),
            "tool_calls": list(self.tool_calls),
            "handles": list(self.handles),
            "missing": list(self.missing),
            "inferred": list(self.inferred),
        }


def _contains(haystack: str, term: str) -> bool:
    return term in haystack


def manifest(
    removed: Sequence[Message],
    seqs: Sequence[int | None],
    replacement: str,
    *,
    handles: Iterable[str] = (),
    previous: str = "",
    summary: str | None = None,
) -> Manifest:
    """Compare ``removed`` (with its stored seqs) with the ``replacement`` text.

    ``summary``: the summarizer's text, checked line by line for inferred statements
    (``previous``: the summary it was given, which also counts as a source).
    """
    source = "\n".join(render_message(m) for m in removed)
    missing = [t for t in salient_terms(source) if not _contains(replacement, t)]
    inferred: list[str] = []
    if summary:
        known = source + "\n" + previous
        for line in summary.splitlines():
            terms = [t for t in salient_terms(line) if not t.isdigit() or len(t) > 1]
            if terms and any(not _contains(known, t) for t in terms):
                inferred.append(line.strip())
    calls = {u.id for m in removed for u in m.tool_uses}
    calls |= {r.tool_use_id for m in removed for r in m.tool_results}
    return Manifest(
        removed_messages=tuple(s for s in seqs if s is not None),
        tool_calls=tuple(sorted(calls)),
        handles=tuple(dict.fromkeys(handles)),
        missing=tuple(missing),
        inferred=tuple(inferred),
    )


def _bounded(items: Sequence[str], room: int) -> str:
    """``items`` joined with commas, cut to ``room`` characters (saying how many more)."""
    out: list[str] = []
    used = 0
    for index, item in enumerate(items):
        if used + len(item) + 2 > room and out:
            return ", ".join(out) + f" (+{len(items) - index} more)"
        out.append(item)
        used += len(item) + 2
    return ", ".join(out)


def handles_line(seqs: Iterable[int], handles: Sequence[str], max_chars: int = 2_000) -> str:
    """The recall handles of a replaced range: message ranges first (always whole: they
    reach every original), then output handles within ``max_chars``."""
    ranges = ", ".join(handle_ranges(seqs))
    room = max(0, max_chars - len(ranges))
    outputs = _bounded(list(dict.fromkeys(handles)), room) if handles and room > 40 else ""
    return ", ".join(p for p in (ranges, outputs) if p)


def dropped_note(
    removed: Sequence[Message],
    seqs: Sequence[int | None],
    handles: Iterable[str],
    max_chars: int = 4_000,
) -> str:
    """The explicit note that stands for messages dropped without a summary.

    The message handles are always listed in full (runs collapse to ``msg-a..msg-b``);
    tool calls, output handles and the digest share what is left of ``max_chars``.
    """
    stored = [s for s in seqs if s is not None]
    names = {u.id: u.name for m in removed for u in m.tool_uses}
    lines = [
        f"{len(removed)} earlier messages were dropped without a summary; nothing is lost: "
        "read any of them with the recall tool by its id."
    ]
    if stored:
        lines.append("Messages: " + ", ".join(handle_ranges(stored)))
    room = max(0, max_chars - sum(len(line) + 1 for line in lines))
    listed = list(dict.fromkeys(handles))
    terms = salient_terms("\n".join(render_message(m) for m in removed))[:_MAX_NOTE_TERMS]
    sections = [
        ("Tool calls: ", [f"{name} ({call_id})" for call_id, name in names.items()]),
        ("Tool outputs: ", [f"recall id={h}" for h in listed]),
        ("Digest (identifiers, numbers, paths, commands): ", terms),
    ]
    share = room // 3
    for title, items in sections:
        if items and share > len(title) + 20:
            lines.append(title + _bounded(items, share - len(title)))
    return "\n".join(lines)
