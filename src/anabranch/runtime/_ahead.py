"""Compaction ahead: the oldest range is summarized in the background from a soft threshold
(``ContextPolicy.compact_ahead_at``) while the agent keeps working; the summary is swapped
in at the next call boundary once it is ready, so the agent does not wait for a summarizer
when it reaches the hard threshold.

Rules:

- The summary is of a *prefix* of the context (the head of the split a compaction would
  make now). It is swapped in only if that prefix is still the context's prefix (no
  boundary since, the same message objects); otherwise it is discarded.
- Nothing is written while it runs: the boundary (with its manifest and derived rows) is
  committed at the swap, by the pipeline step before a call, like any compaction. A crash
  or a cancellation mid-way leaves nothing half-applied; a summary that was not swapped in
  is simply gone (its tokens were spent).
- No silent loss holds as for any summary: every message of the range was in a summarizer
  request (in parts if it does not fit), and the opening names its handles.
- At the hard threshold a summary still in flight is waited for (it is nearer to done than
  a new one); the boundary records whether the call waited (``extra.ahead.waited``).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from anabranch.context._compaction import Split, choose_split
from anabranch.messages import Message
from anabranch.runtime._breaker import breaker_state
from anabranch.runtime._compaction_step import CompactionStep
from anabranch.runtime._context_view import ContextView
from anabranch.runtime._head import originals
from anabranch.runtime._summarizer import SummaryResult

__all__ = ["Ahead", "AheadSummaries", "Ready", "ahead_split"]

_log = logging.getLogger("anabranch.compaction")


@dataclass
class Ahead:
    """One summary computed ahead for one run."""

    index: int
    """Where the context was split: ``head`` is ``context[:index]``."""
    head: tuple[Message, ...]
    seqs: list[int | None]
    boundary_id: int | None
    """The run's latest boundary when it started (another one since: discarded)."""
    tokens: int
    started: float = field(default_factory=time.monotonic)
    ready: anyio.Event = field(default_factory=anyio.Event)
    result: SummaryResult | None = None
    failure: str | None = None

    def record(self, *, waited: bool) -> dict[str, Any]:
        """What the boundary's ``extra.ahead`` says about it."""
        return {
            "waited": waited,
            "started_at_tokens": self.tokens,
            "seconds": round(time.monotonic() - self.started, 3),
        }


@dataclass(frozen=True)
class Ready:
    """A summary ahead to swap in now: the split of the current context it replaces, and
    whether this call had to wait for it."""

    ahead: Ahead
    split: Split
    waited: bool


Summarize = Callable[..., Awaitable[SummaryResult]]
"""``summarize(view, head, seqs, purpose=...)``."""


class AheadSummaries:
    """The summaries in flight or ready, one per run (held while the run lives)."""

    def __init__(self) -> None:
        self._runs: weakref.WeakKeyDictionary[ContextView, Ahead] = weakref.WeakKeyDictionary()

    def due(self, step: CompactionStep, *, threshold: int) -> bool:
        """Whether the run should start one now: past the soft threshold (and below the
        hard one), none in flight, and a task group to run it in."""
        policy = step.agent.context
        at = policy.compact_ahead_at
        if at is None or step.background is None or step.view in self._runs:
            return False
        if policy.strategy != "summarize":
            return False
        return int(policy.window * at) <= step.context_tokens < threshold

    def pending(self, view: ContextView) -> Ahead | None:
        return self._runs.get(view)

    async def start(
        self, step: CompactionStep, split: Split, summarize: Summarize, *, threshold: int
    ) -> None:
        """Summarize ``split.head`` in the run's background task group.

        Not until the context has grown half the way from what the last compaction left
        to the threshold (so a small window does not compact on every turn), nor while the
        breaker is open or half-open (those compactions are the breaker's).
        """
        group = step.background
        assert group is not None
        boundary = await step.store.latest_boundary(step.id)
        if boundary is not None and boundary.tokens_after is not None:
            left = boundary.tokens_after
            if step.context_tokens < left + (threshold - left) // 2:
                return
        if breaker_state(await step.boundaries()) != "closed":
            return
        seqs = await step.context_seqs()
        # cleared results as the tools returned them
        head = await originals(step.store, step.id, split.head, step.pending_spills())
        ahead = Ahead(
            index=split.index,
            head=split.head,
            seqs=seqs[: len(split.head)],
            boundary_id=boundary.id if boundary is not None else None,
            tokens=step.context_tokens,
        )
        self._runs[step.view] = ahead
        group.start_soon(_work, step.view, ahead, head, summarize)

    async def take(self, step: CompactionStep, *, wait: bool) -> Ready | None:
        """The summary to swap in now (``wait``: the one in flight, once it is ready);
        ``None``: none ready, or it failed or was discarded."""
        ahead = self._runs.get(step.view)
        if ahead is None or (not wait and not ahead.ready.is_set()):
            return None
        waited = not ahead.ready.is_set()
        await ahead.ready.wait()
        del self._runs[step.view]
        if ahead.result is None:
            _log.info("summary ahead of %s failed: %s", step.agent.name, ahead.failure)
            return None
        if not await _still_prefix(step, ahead):
            _log.info("summary ahead of %s discarded: the context changed", step.agent.name)
            return None
        return Ready(ahead, Split.at(step.context, ahead.index), waited)


async def _work(
    view: ContextView, ahead: Ahead, head: tuple[Message, ...], summarize: Summarize
) -> None:
    """The background task: never raises (a failure is recorded), commits nothing."""
    try:
        ahead.result = await summarize(view, head, ahead.seqs, purpose="compaction_ahead")
    except Exception as exc:  # the hard threshold compacts inline instead
        ahead.failure = f"{type(exc).__name__}: {exc}"
    finally:
        ahead.ready.set()


async def _still_prefix(step: CompactionStep, ahead: Ahead) -> bool:
    boundary = await step.store.latest_boundary(step.id)
    if (boundary.id if boundary is not None else None) != ahead.boundary_id:
        return False
    count = len(ahead.head)
    if len(step.context) <= count:
        return False
    return all(now is then for now, then in zip(step.context[:count], ahead.head, strict=True))


def ahead_split(step: CompactionStep, *, keep_recent: int, max_tail_tokens: int) -> Split | None:
    """The split a summary ahead replaces the head of: as a compaction now would cut (the
    whole context, if nothing fits the tail's budget: what comes after it is the tail at
    the swap)."""
    return choose_split(
        step.context, keep_recent=keep_recent, max_tail_tokens=max_tail_tokens, empty_tail=True
    )
