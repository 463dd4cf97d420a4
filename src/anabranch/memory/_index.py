"""The ``MEMORY.md`` index as it enters a system prompt: capped, with a visible marker."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["IndexView", "capped_index"]


@dataclass(frozen=True)
class IndexView:
    text: str
    """What the prompt shows (may be cut)."""
    lines: int
    """Entry lines in the whole index."""
    over_cap: bool


def capped_index(index: str, *, max_lines: int, max_bytes: int) -> IndexView:
    """The index cut at ``max_lines`` entry lines or ``max_bytes`` (UTF-8), whichever
    comes first, with a marker that says how much was left out."""
    entries = [line for line in index.splitlines() if line.strip()]
    kept: list[str] = []
    size = 0
    for line in entries:
        cost = len(line.encode("utf-8")) + 1
        if len(kept) >= max_lines or size + cost > max_bytes:
            break
        kept.append(line)
        size += cost
    over = len(kept) < len(entries)
    text = "\n".join(kept)
    if over:
        text += (
            f"\n[... memory index truncated: {len(entries) - len(kept)} of {len(entries)} "
            f"lines not shown (caps: {max_lines} lines, {max_bytes:,} bytes); merge or "
            "shorten entries ...]"
        )
    return IndexView(text=text, lines=len(entries), over_cap=over)
