"""How a compacted context is written down without copying the history.

A context is a list of messages; each is either an original message (stored with its
``seq``) or a derived one (a summary, a stub, an elided copy). A boundary records it as:

- ``prefix``: the derived messages the context opens with (the marked summary);
- ``ranges``: ``[first_seq, last_seq]`` runs of stored messages, in context order, the last
  one open-ended (``[first, None]``) so that messages appended later join the context.

Derived messages after the first position are appended once to the message log (kind
``context``) and referenced by ``seq`` like originals, so they are never copied again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from anabranch.messages import Message

__all__ = ["Layout", "Range", "close_ranges", "encode_layout", "expand_ranges"]

Range = tuple[int, int | None]


@dataclass(frozen=True)
class Layout:
    """A context, encoded: see the module docstring."""

    prefix: tuple[Message, ...]
    ranges: tuple[Range, ...]
    new_rows: tuple[Message, ...]
    """Derived messages to append to the log at ``first_new_seq`` onwards, in order."""
    first_new_seq: int

    @property
    def next_seq(self) -> int:
        """The seq the next appended message gets (the open range starts there)."""
        return self.first_new_seq + len(self.new_rows)


def expand_ranges(
    prefix_len: int, ranges: Sequence[Sequence[int | None]], next_seq: int
) -> list[int | None]:
    """The seq of every context position (``None`` for prefix messages)."""
    seqs: list[int | None] = [None] * prefix_len
    for first, last in ranges:
        assert first is not None
        end = next_seq - 1 if last is None else last
        seqs.extend(range(first, end + 1))
    return seqs


def close_ranges(ranges: Sequence[Sequence[int | None]], next_seq: int) -> list[Range]:
    """``ranges`` with the open one closed at ``next_seq - 1``; empty runs dropped."""
    closed: list[Range] = []
    for first, last in ranges:
        assert first is not None
        end = next_seq - 1 if last is None else last
        if end >= first:
            closed.append((first, end))
    return closed


def encode_layout(
    messages: Sequence[Message], seqs: Sequence[int | None], first_new_seq: int
) -> Layout:
    """Encode ``messages`` (with the stored seq of each, ``None`` for derived ones)."""
    if len(messages) != len(seqs):
        raise ValueError("one seq per message is required")
    prefix: list[Message] = []
    start = 0
    if messages and seqs[0] is None:
        prefix.append(messages[0])
        start = 1
    new_rows: list[Message] = []
    positions: list[int] = []
    for message, seq in zip(messages[start:], seqs[start:], strict=True):
        if seq is None:
            positions.append(first_new_seq + len(new_rows))
            new_rows.append(message)
        else:
            positions.append(seq)
    next_seq = first_new_seq + len(new_rows)
    ranges: list[list[int]] = []
    for seq in positions:
        if ranges and ranges[-1][1] + 1 == seq:
            ranges[-1][1] = seq
        else:
            ranges.append([seq, seq])
    out: list[Range] = [(a, b) for a, b in ranges]
    if out and out[-1][1] == next_seq - 1:
        out[-1] = (out[-1][0], None)
    else:
        out.append((next_seq, None))
    return Layout(tuple(prefix), tuple(out), tuple(new_rows), first_new_seq)
