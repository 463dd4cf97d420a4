"""The new context of one compaction attempt, by strategy: ``summarize``, ``verbatim`` or
``window`` (``server`` in ``_server_compaction``), with its loss manifest, the memories
re-selected and the pins kept, checked against the API's rules before it is returned.
Plain functions of the compaction step and of the pipeline (``Compacting``).
"""

from __future__ import annotations

from typing import Any, Protocol

from anabranch.context._compaction import (
    Rebuilt,
    Split,
    choose_split,
    cleared_context,
    context_violations,
    summarized_context,
    verbatim_context,
    windowed_context,
)
from anabranch.context._content import content_violations
from anabranch.context._digest import (
    Manifest,
    dropped_note,
    handles_line,
    manifest,
    named_seqs,
)
from anabranch.context._tokens import estimate_messages
from anabranch.context._transcript import chars_for_tokens
from anabranch.runtime._ahead import Ready
from anabranch.runtime._compaction_step import CompactionStep
from anabranch.runtime._context_view import ContextView
from anabranch.runtime._head import context_text, handles_in, originals, previous_summary
from anabranch.runtime._memory_compaction import CompactionMemory
from anabranch.runtime._model_switch import ModelSwitch
from anabranch.runtime._pins import with_pins
from anabranch.runtime._server_compaction import server_rebuild
from anabranch.runtime._summary_calls import (
    Sizing,
    call_summarizer,
    fixed_tokens,
    pre_compact_hook,
    summarize_head,
)

__all__ = [
    "KEEP_NOTHING_LEVEL",
    "MIN_FREE_FRACTION",
    "TAIL_SHARE",
    "Compacting",
    "CompactionError",
    "frees_too_little",
    "note_chars",
    "rebuild",
    "stub_only",
    "tail_budget",
]

MIN_FREE_FRACTION = 0.05
"""A proactive compaction that would free less than this share of the window is skipped
(unless the context no longer fits at all)."""
TAIL_SHARE = 0.25
"""Default ``keep_recent_tokens``: this share of the room messages have below the threshold."""
KEEP_NOTHING_LEVEL = 2
"""Reactive level from which nothing is kept verbatim: the whole context is summarized."""


class CompactionError(Exception):
    """A compaction attempt could not produce a valid context."""


class Compacting(Sizing, Protocol):
    """What of ``CompactingPipeline`` a rebuild uses: its sizes and the model switch check."""

    def model_switch(self, run: ContextView) -> ModelSwitch | None: ...


def tail_budget(pipeline: Compacting, run: ContextView, level: int) -> int:
    """Tokens the kept tail may hold (``keep_recent_tokens``, or a share of the room)."""
    room = max(0, pipeline.threshold(run) - fixed_tokens(run))
    budget = run.agent.context.keep_recent_tokens
    budget = int(room * TAIL_SHARE) if budget is None else min(budget, room // 2)
    return budget >> level


async def rebuild(
    pipeline: Compacting,
    step: CompactionStep,
    strategy: str,
    trigger: str,
    level: int,
    seqs: list[int | None],
    details: dict[str, Any],
    ready: Ready | None = None,
) -> tuple[Rebuilt, Manifest | None] | None:
    if strategy == "server":  # the API writes the summary: see ``_server_compaction``
        return await server_rebuild(step, level, tail_budget(pipeline, step, level), seqs, details)
    policy = step.agent.context
    nothing = level >= KEEP_NOTHING_LEVEL
    split = (
        ready.split
        if ready is not None
        else choose_split(
            step.context,
            keep_recent=0 if nothing else policy.keep_recent >> level,
            max_tail_tokens=0 if nothing else tail_budget(pipeline, step, level),
            empty_tail=True,
        )
    )
    if split is None:
        stubbed = stub_only(step, level)
        return stubbed, None
    head_seqs = seqs[: len(split.head)]
    # what an earlier opening in the head stood for stays named in the new one
    earlier = named_seqs(previous_summary(split.head))
    named = sorted({*earlier, *(s for s in head_seqs if s is not None)})
    if trigger == "auto" and frees_too_little(pipeline, step, split):
        return None
    head = await originals(step.store, step.id, split.head, step.pending_spills())
    instructions = None
    if ready is None:  # a summary ahead had them when it started
        instructions = await pre_compact_hook(pipeline, step, split, strategy, trigger)
    handles = handles_in(split.head)
    memory = CompactionMemory(
        step, lambda request: call_summarizer(pipeline, step, request), pipeline.window(step)
    )
    if strategy == "summarize":
        details.update(await memory.extract(head, head_seqs))
        result = ready.ahead.result if ready is not None else None
        if result is not None and ready is not None:
            details["ahead"] = ready.ahead.record(waited=ready.waited)
        else:
            switch = pipeline.model_switch(step)
            if switch is not None:
                details["model_switch"] = switch.as_dict()
            result = await summarize_head(
                pipeline, step, head, head_seqs, instructions, switch=switch
            )
        details["model"] = result.model
        details["summary"] = result.summary
        details["usage"] = result.usage.model_dump(mode="json")
        details["summary_parts"] = result.parts
        details["summary_requests"] = len(result.requests)
        listed = handles_line(named, handles, note_chars(pipeline, step))
        rebuilt = summarized_context(split, result.summary, listed)
        found = manifest(
            split.head,
            head_seqs,
            result.summary,
            handles=handles,
            previous=previous_summary(split.head),
            summary=result.summary,
        )
    elif strategy == "verbatim":
        rebuilt = verbatim_context(split, step.id)
        handles += [spill.handle for spill in rebuilt.spills]
        found = manifest(split.head, head_seqs, context_text(rebuilt.messages), handles=handles)
    else:
        spilled = cleared_context(split.head, keep_last=0, run_id=step.id).spills
        handles += [spill.handle for spill in spilled]
        note = dropped_note(split.head, named, handles, note_chars(pipeline, step))
        rebuilt = windowed_context(split, note)
        rebuilt = Rebuilt(rebuilt.messages, rebuilt.sources, rebuilt.kept, spilled)
        found = manifest(split.head, head_seqs, context_text(rebuilt.messages), handles=handles)
    details["manifest"] = found.as_dict()
    rebuilt = await memory.reselect(head, rebuilt, note_chars(pipeline, step), details)
    room = max(0, pipeline.threshold(step) - fixed_tokens(step))
    carry = split.carry if strategy != "verbatim" else None
    rebuilt = await with_pins(step, rebuilt, room, carry, details)
    problems = context_violations(rebuilt.messages)
    problems += content_violations(
        step.context, rebuilt.messages, thinking=step.agent.model_settings.thinking
    )
    if problems:
        raise CompactionError("invalid compacted context: " + "; ".join(problems))
    return rebuilt, found


def note_chars(pipeline: Compacting, run: ContextView) -> int:
    """Room for a note of what was replaced: a tenth of the messages' room."""
    room = max(0, pipeline.threshold(run) - fixed_tokens(run))
    return max(200, chars_for_tokens(room // 10))


def frees_too_little(pipeline: Compacting, run: ContextView, split: Split) -> bool:
    """A proactive compaction of ``split`` would free under ``MIN_FREE_FRACTION``."""
    window = pipeline.window(run)
    head = estimate_messages(split.head)
    after = fixed_tokens(run) + estimate_messages(split.tail) + head // 4
    if after >= window - run.agent.context.reserve:
        return False  # must compact whatever it frees
    return head - head // 4 < window * MIN_FREE_FRACTION


def stub_only(run: ContextView, level: int) -> Rebuilt:
    """No turn left to cut: a reactive retry can still stub the kept tool results."""
    if not level:
        raise CompactionError("nothing to compact: no turn boundary to cut at")
    rebuilt = cleared_context(run.context, keep_last=0, run_id=run.id, clearable=run.clearable)
    if not rebuilt.spills:
        raise CompactionError("nothing to compact: no turn boundary to cut at")
    return rebuilt
