"""``Budget``: how many tokens and dollars a run, a session or a tenant may spend."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Budget", "BudgetPeriod", "OnLimit"]

BudgetPeriod = Literal["day", "month"]
OnLimit = Literal["report", "fail"]
"""What a run does at a limit: write a final report without tools (``report``), or fail."""


class Budget(BaseModel):
    """A spending limit. Tokens count every paid token of every model call (uncached,
    cache-read and cache-write input, and output), summarizer calls included; cost is
    estimated from the price table.

    Args:
        max_tokens: tokens that may be spent; ``None``: no token limit.
        max_cost_usd: estimated US dollars that may be spent; ``None``: no cost limit.
        per: for a tenant budget, the calendar period (UTC) it renews over; ``None``: it
            never renews. An agent's or a session's budget is per run: leave it ``None``.
        soft: at this share of a limit the agent is told (in its next user turn) how much
            is left and to wrap up (a share past ``1 - reserve`` is never reached: the run
            stops first).
        reserve: the share of a limit held back for final reports: once a run's spend
            (with its next call) would pass ``1 - reserve`` of a limit, it stops and writes
            its report within the reserve.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int | None = Field(None, gt=0)
    max_cost_usd: float | None = Field(None, gt=0)
    per: BudgetPeriod | None = None
    soft: float = Field(0.8, gt=0.0, le=1.0)
    reserve: float = Field(0.1, ge=0.0, lt=1.0)

    @property
    def limited(self) -> bool:
        """Whether the budget limits anything."""
        return self.max_tokens is not None or self.max_cost_usd is not None

    def describe(self) -> str:
        """A short text such as ``150,000 tokens, $5.00 per day``."""
        parts = []
        if self.max_tokens is not None:
            parts.append(f"{self.max_tokens:,} tokens")
        if self.max_cost_usd is not None:
            parts.append(f"${self.max_cost_usd:,.2f}")
        text = ", ".join(parts) or "unlimited"
        return f"{text} per {self.per}" if self.per else text
