"""Compaction as pure message transforms: where to split, and what replaces the head.

Representation (always valid Messages API input):

- A compacted context opens with one **user** turn whose first text block is a marker,
  ``<compacted_context strategy=... replaced_messages=N>`` (see ``is_compaction_message``):
  the summary (``summarize``), the first request (``window``) or the elided history
  (``verbatim``) follows it.
- The kept tail starts right after the opening, on an **assistant** turn, so roles keep
  alternating and every ``tool_use`` in the tail has its ``tool_result`` right after it.
  When the split falls on a plain user turn (text only, no tool results), that turn is
  merged into the opening instead (the opening's blocks, then that turn's blocks).

A split is therefore an index ``s >= 1`` where ``messages[s]`` is an assistant turn or a
plain user turn; nothing else is ever cut. ``context_violations`` checks the result.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from anabranch.context._budget import ClearedResult, clear_tool_results, spill_handle
from anabranch.context._pairing import pairing_violations
from anabranch.context._tokens import estimate_messages
from anabranch.messages import (
    Block,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    canonical_json,
)

__all__ = [
    "COMPACTION_MARKER",
    "PART_PROMPT",
    "CompactionEvent",
    "Rebuilt",
    "Split",
    "SummaryError",
    "choose_split",
    "cleared_context",
    "context_violations",
    "elide_message",
    "extract_summary",
    "is_compaction_message",
    "split_points",
    "summarized_context",
    "summary_part_request",
    "summary_request",
    "verbatim_context",
    "windowed_context",
]

COMPACTION_MARKER = "<compacted_context"
"""The first text block of a compacted context's opening turn starts with this."""

_INPUT_PREVIEW_CHARS = 200
_DROPPED_TAG = "<dropped_messages>"
"""Opens the note of a ``window`` compaction; a later one replaces it (its note covers it)."""

SUMMARY_PROMPT = """\
This conversation is being compacted: the messages above will be replaced by the summary \
you write now, and the work continues from it. Do not call any tools.

First think inside <analysis></analysis>: go through the conversation in order and note \
everything later work depends on. Then write the summary inside <summary></summary> with \
these sections:
1. Request: what the user asked (quote the exact wording where it matters).
2. Decisions: what was decided, and why.
3. Files and identifiers: paths, names, ids, URLs and numbers that later work needs.
4. Errors and fixes: what went wrong and how it was resolved.
5. Current work: what was being done right before this point.
6. Next steps: what remains, in order.

Only the summary is kept; the analysis is dropped. The most recent messages stay verbatim \
after your summary, and the originals stay retrievable with the recall tool."""


class SummaryError(ValueError):
    """The summarizer's answer holds no usable summary."""


# ---------------------------------------------------------------------------- markers
def _marker(strategy: str, count_name: str, count: int, note: str) -> TextBlock:
    return TextBlock(
        text=f'{COMPACTION_MARKER} strategy="{strategy}" {count_name}="{count}">'
        f"{note}</compacted_context>"
    )


def is_compaction_message(message: Message) -> bool:
    """True for the opening turn of a compacted context (summary, window or verbatim)."""
    if message.role != "user" or not message.content:
        return False
    first = message.content[0]
    return isinstance(first, TextBlock) and first.text.startswith(COMPACTION_MARKER)


def _without_marker(message: Message) -> tuple[Block, ...]:
    """A message's blocks minus a leading compaction marker."""
    if is_compaction_message(message):
        return message.content[1:]
    return message.content


# ---------------------------------------------------------------------------- splitting
@dataclass(frozen=True)
class Split:
    """Where a context is cut: ``head`` is replaced, ``tail`` is kept verbatim."""

    index: int
    head: tuple[Message, ...]
    carry: Message | None
    """A plain user turn at the split, merged into the opening (``None`` usually)."""
    tail: tuple[Message, ...]

    @property
    def tail_start(self) -> int:
        """Position in the old context of the first tail message."""
        return self.index + (1 if self.carry is not None else 0)

    @property
    def kept(self) -> int:
        return len(self.tail) + (1 if self.carry is not None else 0)

    @classmethod
    def at(cls, messages: Sequence[Message], index: int) -> Split:
        if index == len(messages) and _may_keep_nothing(messages):
            return cls(index, tuple(messages), None, ())
        if index not in split_points(messages):
            raise ValueError(f"cannot split at {index}: it would break a turn or a tool pair")
        at = messages[index]
        carry = at if at.role == "user" else None
        start = index + (1 if carry is not None else 0)
        return cls(index, tuple(messages[:index]), carry, tuple(messages[start:]))


def split_points(messages: Sequence[Message]) -> list[int]:
    """Every index the context may be cut at, ascending (see the module docstring)."""
    points = []
    for index in range(1, len(messages)):
        message = messages[index]
        if message.role == "assistant" or not message.tool_results:
            points.append(index)
    if points and points[0] == 1 and is_compaction_message(messages[0]):
        points.pop(0)  # replacing only the previous opening gains nothing
    return points


def _may_keep_nothing(messages: Sequence[Message]) -> bool:
    """Whether the whole context may be replaced (the opening is then the last turn).

    Only when it ends on tool results: a plain user turn at the end is a new request, kept
    word for word by the split at it (merged into the opening)."""
    if len(messages) < 2 or messages[-1].role != "user" or not messages[-1].tool_results:
        return False
    return not (len(messages) == 2 and is_compaction_message(messages[0]))


def choose_split(
    messages: Sequence[Message],
    *,
    keep_recent: int,
    max_tail_tokens: int,
    empty_tail: bool = False,
) -> Split | None:
    """The split that keeps the most recent messages within both limits.

    At most ``keep_recent`` messages and ``max_tail_tokens`` (estimated) are kept; when no
    split meets both, the one keeping the fewest messages. With ``empty_tail``, keeping
    nothing (the whole context replaced; it must end on a user turn) is allowed too.
    ``None``: nothing can be cut.
    """
    points = split_points(messages)
    if empty_tail and _may_keep_nothing(messages):
        points.append(len(messages))
    if not points:
        return None
    suffix = [0] * (len(messages) + 1)
    for i in range(len(messages) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + estimate_messages([messages[i]])
    for index in points:
        if len(messages) - index <= keep_recent and suffix[index] <= max_tail_tokens:
            return Split.at(messages, index)
    return Split.at(messages, points[-1])


# ---------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Rebuilt:
    """A new context, with where each message came from in the old one."""

    messages: tuple[Message, ...]
    sources: tuple[int | None, ...]
    """Index of each message in the old context; ``None`` for new or changed messages."""
    kept: int = 0
    """Messages of the old context kept verbatim after the opening."""
    spills: tuple[ClearedResult, ...] = field(default=())
    """Tool outputs that left the context and must be recallable by handle."""


def _opening(marker: TextBlock, body: Sequence[Block], carry: Message | None) -> Message:
    blocks: list[Block] = [marker, *body]
    if carry is not None:
        blocks.extend(carry.content)
    return Message(role="user", content=tuple(blocks))


_COUNT = re.compile(r'^<compacted_context strategy="\w+" \w+="(\d+)">')


def _replaced_count(head: Sequence[Message]) -> int:
    """Original messages replaced, counting what earlier openings already stood for."""
    total = 0
    for message in head:
        first = message.content[0] if message.content else None
        match = _COUNT.match(first.text) if isinstance(first, TextBlock) else None
        total += int(match.group(1)) if match and is_compaction_message(message) else 1
    return total


def _with_tail(opening: Message, split: Split) -> Rebuilt:
    messages = (opening, *split.tail)
    sources = (None, *range(split.tail_start, split.tail_start + len(split.tail)))
    return Rebuilt(messages, sources, kept=split.kept)


def summarized_context(split: Split, summary: str, handles: str = "") -> Rebuilt:
    """``summarize``: the marked summary (plus a merged plain turn), then the tail.

    ``handles``: a line naming the recall handles of what the summary replaced.
    """
    replaced = _replaced_count(split.head)
    marker = _marker(
        "summarize",
        "replaced_messages",
        replaced,
        f"The earlier conversation ({replaced} messages) was compacted into the summary "
        "below. The original messages are kept: search them, or fetch an id, with the "
        "recall tool.",
    )
    text = f"<summary_of_earlier_conversation>\n{summary.strip()}\n"
    if handles.strip():
        text += f"<recall_handles>{handles.strip()}</recall_handles>\n"
    body = TextBlock(text=text + "</summary_of_earlier_conversation>")
    return _with_tail(_opening(marker, (body,), split.carry), split)


def windowed_context(split: Split, note: str = "") -> Rebuilt:
    """``window``: drop the oldest turns; the opening keeps the first request (no model).

    ``note``: the explicit note naming what was dropped (``context.digest.dropped_note``).
    """
    first = split.head[0]
    dropped = _replaced_count(split.head) - (0 if is_compaction_message(first) else 1)
    marker = _marker(
        "window",
        "dropped_messages",
        dropped,
        f"{dropped} earlier messages were dropped to fit the context window. They are "
        "kept: search them, or fetch an id, with the recall tool. What opened the "
        "conversation follows.",
    )
    body: tuple[Block, ...] = tuple(
        b
        for b in _without_marker(first)
        if isinstance(b, TextBlock) and not b.text.startswith(_DROPPED_TAG)
    )
    if note.strip():
        body = (*body, TextBlock(text=f"{_DROPPED_TAG}\n{note.strip()}\n</dropped_messages>"))
    return _with_tail(_opening(marker, body, split.carry), split)


def elide_message(
    message: Message, names: dict[str, str], run_id: str | None = None
) -> tuple[Message, list[ClearedResult]]:
    """Prose word for word; each tool call and result becomes a one-line text note.

    With ``run_id``, each elided result names its recall handle (and is listed for
    spilling); the message itself is returned unchanged when it has no tool blocks.
    """
    if not message.tool_uses and not message.tool_results:
        return message, []
    blocks: list[Block] = []
    spills: list[ClearedResult] = []
    for block in message.content:
        if isinstance(block, ToolUseBlock):
            arguments = canonical_json(block.input)
            if len(arguments) > _INPUT_PREVIEW_CHARS:
                arguments = arguments[:_INPUT_PREVIEW_CHARS] + "…"
            blocks.append(TextBlock(text=f"[tool call {block.name} id={block.id}: {arguments}]"))
        elif isinstance(block, ToolResultBlock):
            kind = "error, " if block.is_error else ""
            name = names.get(block.tool_use_id, "tool")
            note = (
                f"[tool result of {name} id={block.tool_use_id}: {kind}"
                f"{len(block.content):,} characters elided"
            )
            note += "".join(f", {a.type} {a.size:,} bytes" for a in block.attachments)
            if run_id is not None:
                handle = spill_handle(run_id, block.tool_use_id)
                note += f"; recall id={handle}"
                spills.append(
                    ClearedResult(block.tool_use_id, handle, block.content, block.attachments)
                )
            blocks.append(TextBlock(text=note + "]"))
        else:
            blocks.append(block)
    return Message(role=message.role, content=tuple(blocks)), spills


def verbatim_context(split: Split, run_id: str) -> Rebuilt:
    """``verbatim``: every prose message kept, tool payloads in the head elided; no model."""
    messages = (*split.head, *((split.carry,) if split.carry else ()), *split.tail)
    head_len = len(split.head)
    names = {u.id: u.name for m in split.head for u in m.tool_uses}
    out: list[Message] = []
    sources: list[int | None] = []
    spills: list[ClearedResult] = []
    for index, message in enumerate(split.head):
        elided, spilled = elide_message(message, names, run_id)
        spills.extend(spilled)
        out.append(elided)
        sources.append(index if elided is message else None)
    if not is_compaction_message(out[0]):
        marker = _marker(
            "verbatim",
            "elided_messages",
            head_len,
            "Earlier messages are kept word for word below; the inputs and outputs of "
            "their tool calls were elided (fetch an output with the recall tool by its id).",
        )
        out[0] = Message(role="user", content=(marker, *out[0].content))
        sources[0] = None
    out.extend(messages[head_len:])
    sources.extend(range(head_len, len(messages)))
    return Rebuilt(tuple(out), tuple(sources), kept=split.kept, spills=tuple(spills))


def cleared_context(
    messages: Sequence[Message],
    *,
    keep_last: int,
    run_id: str,
    clearable: Callable[[str], bool] | None = None,
) -> Rebuilt:
    """Old tool results replaced by stubs (see ``budget.clear_tool_results``)."""
    new, cleared = clear_tool_results(
        messages, keep_last=keep_last, run_id=run_id, clearable=clearable
    )
    pairs = enumerate(zip(new, messages, strict=True))
    sources = tuple(i if n is o else None for i, (n, o) in pairs)
    return Rebuilt(tuple(new), sources, kept=len(messages), spills=tuple(cleared))


# ---------------------------------------------------------------------------- summarizer
def summary_request(head: Sequence[Message], instructions: str | None = None) -> list[Message]:
    """The messages sent to the summarizer: ``head`` plus the request for a summary.

    ``head`` is a valid prefix of the context, so the request reuses its cached prefix.
    """
    prompt = SUMMARY_PROMPT
    if instructions and instructions.strip():
        prompt += "\n\nAdditional instructions for this summary:\n" + instructions.strip()
    messages = list(head)
    if messages and messages[-1].role == "user":
        last = messages[-1]
        messages[-1] = Message(role="user", content=(*last.content, TextBlock(text=prompt)))
    else:
        messages.append(Message.user(prompt))
    return messages


PART_PROMPT = """\
The conversation is being compacted in parts because it is too long for one request. \
Above is part {index} of {total}, and the summary of everything before it. Write one \
summary of the earlier summary and this part together, keeping every identifier, number, \
path, command and finding of both, inside <summary></summary>. Do not call any tools."""


def summary_part_request(
    running: str, part: str, index: int, total: int, instructions: str | None = None
) -> list[Message]:
    """One request of a summary in parts: the running summary, the next part, the ask."""
    prompt = PART_PROMPT.format(index=index, total=total)
    if instructions and instructions.strip():
        prompt += "\n\nAdditional instructions for this summary:\n" + instructions.strip()
    earlier = running.strip() or "(this is the first part)"
    return [
        Message.user(
            f"<summary_so_far>\n{earlier}\n</summary_so_far>\n"
            f'<conversation_part index="{index}" of="{total}">\n{part}\n'
            f"</conversation_part>\n\n{prompt}"
        )
    ]


_SUMMARY = re.compile(r"<summary>(.*?)</summary>", re.DOTALL)
_ANALYSIS = re.compile(r"<analysis>.*?(</analysis>|\Z)", re.DOTALL)


def extract_summary(text: str) -> str:
    """The text inside ``<summary>``; the analysis is dropped. Raises ``SummaryError``."""
    found: list[str] = [str(s).strip() for s in _SUMMARY.findall(text) if str(s).strip()]
    if found:
        return found[-1]
    if "<summary>" in text:  # cut off by max_tokens: keep what was written
        rest = text.rsplit("<summary>", 1)[1].strip()
        if rest:
            return rest
    rest = _ANALYSIS.sub("", text).strip()
    if not rest:
        raise SummaryError("the summarizer answered without a summary")
    return rest


# ---------------------------------------------------------------------------- checks
def context_violations(messages: Sequence[Message]) -> list[str]:
    """Every reason ``messages`` is not a valid compacted context (empty when valid)."""
    problems = pairing_violations(messages)
    if not messages:
        problems.append("the context is empty")
    for index, message in enumerate(messages):
        if not message.content:
            problems.append(f"messages.{index}: empty content")
        if any(isinstance(b, TextBlock) and not b.text for b in message.content):
            problems.append(f"messages.{index}: empty text block")
        if index and is_compaction_message(message):
            problems.append(f"messages.{index}: a compaction opening must come first")
    return problems


@dataclass(frozen=True)
class CompactionEvent:
    """What an ``on_compact`` hook receives: the messages about to be compacted.

    The hook may save what it wants and return extra instructions for the summary
    (a string), or ``None``.
    """

    agent: str
    session_id: str
    run_id: str
    trigger: str
    strategy: str
    messages: tuple[Message, ...]
    """The messages about to be replaced (the head)."""
    kept: tuple[Message, ...]
    """The messages kept verbatim after the opening."""
    tokens: int
    threshold: int
    window: int
