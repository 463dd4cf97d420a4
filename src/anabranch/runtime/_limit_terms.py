"""The terms limits are stated in: what was spent (``Spend``), a budget and its spend
(``BudgetScope``), why a run stops (``LimitStop``, stored as its ``describe()``) and what
the next user turn carries (``TurnNotes``). ``SessionLimits`` (``_run_limits``) keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from anabranch.agents import Budget
from anabranch.messages import TextBlock, Usage

__all__ = [
    "NO_NOTES",
    "STOP_NOTICE",
    "BudgetScope",
    "LimitStop",
    "Spend",
    "StopReason",
    "TurnNotes",
    "parse_stop",
    "spend_left",
    "spend_share",
    "usage_tokens",
]

StopReason = Literal["max_turns", "timeout", "budget"]

STOP_NOTICE = (
    "[limit reached] You have reached {detail}. You can no longer call tools. Write your "
    "final report now: what you found (with its sources), what is still open, and say "
    "plainly that the work is incomplete."
)


def usage_tokens(usage: Usage) -> int:
    """Paid tokens of one call: uncached, cache-read and cache-write input, and output."""
    return (
        usage.input_tokens
        + usage.cache_read_input_tokens
        + usage.cache_creation_input_tokens
        + usage.output_tokens
    )  # ``total_input_tokens + output_tokens``, summed in one expression (once per call)


@dataclass
class Spend:
    """Tokens and estimated dollars spent."""

    tokens: int = 0
    cost_usd: float = 0.0

    def add(self, other: Spend) -> None:
        self.tokens += other.tokens
        self.cost_usd += other.cost_usd

    def add_call(self, tokens: int, cost_usd: float) -> None:
        """``add(Spend(tokens, cost_usd))`` without the ``Spend``."""
        self.tokens += tokens
        self.cost_usd += cost_usd

    def __add__(self, other: Spend) -> Spend:
        return Spend(self.tokens + other.tokens, self.cost_usd + other.cost_usd)


def spend_share(spent: Spend, budget: Budget) -> float:
    """The largest share of any of the budget's limits that ``spent`` uses."""
    shares = [0.0]
    if budget.max_tokens is not None:
        shares.append(spent.tokens / budget.max_tokens)
    if budget.max_cost_usd is not None:
        shares.append(spent.cost_usd / budget.max_cost_usd)
    return max(shares)


def spend_left(spent: Spend, budget: Budget) -> str:
    parts = []
    if budget.max_tokens is not None:
        left = max(budget.max_tokens - spent.tokens, 0)
        parts.append(f"{left:,} of {budget.max_tokens:,} tokens")
    if budget.max_cost_usd is not None:
        left_usd = max(budget.max_cost_usd - spent.cost_usd, 0.0)
        parts.append(f"${left_usd:,.2f} of ${budget.max_cost_usd:,.2f}")
    return " and ".join(parts)


@dataclass(frozen=True)
class LimitStop:
    """Why a run is stopped: which limit, in words a model and a person can read."""

    reason: StopReason
    detail: str
    """e.g. ``its turn limit (max_turns=8)`` or ``the session budget (2,000,000 tokens)``."""
    scope: str = ""
    """For a budget: ``session``, ``tenant <name>`` or ``agent <name>``."""

    def describe(self) -> str:
        """What is stored as the run's stop: ``<reason>: stopped by <detail>``."""
        return f"{self.reason}: stopped by {self.detail}"


def parse_stop(text: str | None) -> tuple[StopReason | None, str]:
    """The stop reason and its description from a stored ``LimitStop.describe()``."""
    if not text:
        return None, ""
    head, _, rest = text.partition(": ")
    if head in ("max_turns", "timeout", "budget"):
        reason: StopReason = head  # type: ignore[assignment]
        return reason, rest
    return None, text


@dataclass
class BudgetScope:
    """One budget and what was spent against it."""

    name: str
    """``session``, ``tenant acme`` or ``agent researcher``."""
    label: str
    """How the agent is told about it: ``the session budget``, ``your budget``."""
    budget: Budget
    spent: Spend = field(default_factory=Spend)

    def share(self, extra: Spend | None = None) -> float:
        return spend_share(self.spent + extra if extra else self.spent, self.budget)


@dataclass(frozen=True)
class TurnNotes:
    """What the loop adds to the next user turn: a stop notice, or soft-limit notes."""

    stop: LimitStop | None = None
    notes: tuple[str, ...] = ()
    notice: bool = True
    """Whether the stop is announced (not with ``on_limit="fail"``: the run just fails)."""

    @property
    def blocks(self) -> tuple[TextBlock, ...]:
        if not self.notes and self.stop is None:  # most turns: nothing to add
            return ()
        texts = [*self.notes]
        if self.stop is not None and self.notice:
            texts.append(STOP_NOTICE.format(detail=self.stop.detail))
        return tuple(TextBlock(text=t) for t in texts)


NO_NOTES = TurnNotes()
"""A user turn with nothing to add (most turns): one shared, immutable value."""
