"""The context window in force for a run: declared by its agent, or learned from its channel.

A window is a function of model *and channel*: behind a gateway a 1M-token model may stop
at 200K, or at whatever ``max_input_tokens`` the gateway's operator configured. When a
call is refused for length, the error states the limit and often the channel's own count of
the prompt; the ratio between that count and our estimate scales the limit into our units
(a gateway that counts 1.6 tokens for each of ours fills its 6,000 at about 3,700 of ours).
The result is kept per ``(model, channel)``, so sibling runs and later sessions of the same
process start with it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from anabranch.errors import PromptTooLongError
from anabranch.runtime._context_view import ContextView
from anabranch.store import ContextLimitRecord

__all__ = ["ChannelLimits", "LearnedLimit", "LimitSource", "channel_of", "learned_from"]

LimitSource = Literal["learned", "configured"]
"""Where a limit that is not the agent's declared window came from."""

RECORDED = 10_000
"""Run ids remembered as recorded (a long-lived runtime forgets the oldest)."""
MAX_RATIO = 8.0
"""Largest count-to-estimate ratio believed (beyond it, the count is not of this prompt)."""


@dataclass(frozen=True)
class LearnedLimit:
    """A limit one channel enforces for one model, in the channel's and in our units."""

    model: str
    channel: str | None
    maximum: int
    """The limit as the channel stated it, in its own tokens."""
    ratio: float = 1.0
    """The channel's count over our estimate of the same prompt (1.0 when not stated)."""
    source: LimitSource = "learned"

    @property
    def window(self) -> int:
        """The limit in our units (what ``run.context_tokens`` is compared with)."""
        return max(1, int(self.maximum / self.ratio))


def channel_of(run: ContextView) -> str | None:
    """The channel the run's model calls go through (a base URL, a cloud), if it says."""
    return run.channel


def learned_from(
    error: PromptTooLongError, *, model: str, channel: str | None, estimate: int
) -> LearnedLimit | None:
    """What ``error`` teaches about the channel's limit, given our estimate of the prompt."""
    if not error.maximum:
        return None
    ratio = 1.0
    if error.tokens and estimate > 0:
        ratio = min(max(error.tokens / estimate, 1.0), MAX_RATIO)
    return LearnedLimit(model=model, channel=channel, maximum=error.maximum, ratio=ratio)


def _configured(run: ContextView) -> LearnedLimit | None:
    """The limit the model client was told its channel enforces (``context_window=``)."""
    window = run.configured_window
    if window is None or window <= 0:
        return None
    return LearnedLimit(
        model=run.agent.model, channel=channel_of(run), maximum=window, source="configured"
    )


def _tighter(a: LearnedLimit | None, b: LearnedLimit | None) -> LearnedLimit | None:
    if a is None or b is None:
        return a or b
    return a if a.window <= b.window else b


class ChannelLimits:
    """Limits per ``(model, channel)``: configured on the client, or learned (the tightest
    kept), loaded from the store the first time a run on that key calls, and saved there
    when learned; each run's limit, when not its declared window, is recorded for ``show``.
    """

    def __init__(self) -> None:
        self._limits: dict[tuple[str, str | None], LearnedLimit] = {}
        self._loaded: set[tuple[str, str]] = set()
        self._recorded: dict[str, None] = {}
        """Runs whose limit is recorded (by id; the oldest forgotten past ``RECORDED``)."""

    def get(self, run: ContextView) -> LearnedLimit | None:
        """The limit in force for ``run``'s model on its channel, if not just declared."""
        configured = _configured(run)
        if not self._limits:  # nothing learned (asked several times before every call)
            return configured
        return _tighter(self._limits.get((run.agent.model, channel_of(run))), configured)

    def remember(self, limit: LearnedLimit) -> LearnedLimit:
        """Keep ``limit`` unless a tighter one is known; returns the one in force."""
        key = (limit.model, limit.channel)
        known = self._limits.get(key)
        if known is not None and known.window <= limit.window:
            return known
        self._limits[key] = limit
        return limit

    def window(self, run: ContextView) -> int:
        """The run's window: its policy's, or less if its channel says so."""
        declared = run.agent.context.window
        limit = self.get(run)
        return declared if limit is None else min(declared, limit.window)

    async def prepare(self, run: ContextView) -> None:
        """Before a call: load what the store knows of this key; record the run's limit."""
        channel = channel_of(run)
        if channel is None:
            return
        key = (run.agent.model, channel)
        if key not in self._loaded:
            self._loaded.add(key)
            stored = await run.store.context_limit(*key)
            if stored is not None:
                self.remember(
                    LearnedLimit(
                        model=stored.model,
                        channel=stored.channel,
                        maximum=stored.maximum,
                        ratio=stored.ratio,
                        source=stored.source,
                    )
                )
        limit = self.get(run)
        if limit is not None and run.id not in self._recorded and limit.window < self.declared(run):
            self._note_recorded(run.id)
            await run.store.save_context_limit(_record(limit, channel, run.id))

    def prepared(self, run: ContextView) -> bool:
        """Whether ``prepare(run)`` has nothing left to do (so it would not await)."""
        channel = run.channel  # (``channel_of``: asked before every call)
        if channel is None:
            return True
        if (run.agent.model, channel) not in self._loaded:
            return False
        limit = self.get(run)
        return limit is None or run.id in self._recorded or limit.window >= self.declared(run)

    def _note_recorded(self, run_id: str) -> None:
        self._recorded[run_id] = None
        if len(self._recorded) > RECORDED:
            del self._recorded[next(iter(self._recorded))]

    @staticmethod
    def declared(run: ContextView) -> int:
        return run.agent.context.window

    async def learn(
        self,
        run: ContextView,
        error: PromptTooLongError,
        *,
        model: str | None = None,
        estimate: int | None = None,
    ) -> LearnedLimit | None:
        """Learn from a refusal of a prompt of ``run`` (its own, or a summarizer's for
        ``model``, estimated at ``estimate``); saved for later runs; the limit now known."""
        model = model or run.agent.model
        channel = channel_of(run)
        limit = learned_from(
            error,
            model=model,
            channel=channel,
            estimate=run.context_tokens if estimate is None else estimate,
        )
        if limit is None:
            return None
        kept = self.remember(limit)
        if kept is limit and channel is not None:
            await run.store.save_context_limit(_record(limit, channel, None))
            if model == run.agent.model:
                self._note_recorded(run.id)
                await run.store.save_context_limit(_record(limit, channel, run.id))
        return kept


def _record(limit: LearnedLimit, channel: str, run_id: str | None) -> ContextLimitRecord:
    return ContextLimitRecord(
        model=limit.model,
        channel=channel,
        maximum=limit.maximum,
        ratio=limit.ratio,
        window=limit.window,
        source=limit.source,
        created=time.time(),
        run_id=run_id,
    )
