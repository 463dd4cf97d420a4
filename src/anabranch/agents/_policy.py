"""``ContextPolicy``: how one agent's context is kept within its own window."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["CompactionStrategy", "ContextPolicy"]

CompactionStrategy = Literal["summarize", "verbatim", "window", "server"]


class ContextPolicy(BaseModel):
    """Per-agent context settings. Each agent run compacts at its own window."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    window: int = Field(200_000, gt=0)
    """Context window in tokens."""
    compact_at: float = Field(0.7, gt=0.0, le=1.0)
    """Compact when the context reaches this fraction of ``window``."""
    output_reserve: int = Field(4_096, ge=0)
    """Tokens kept free for the answer; the threshold never exceeds window - reserve.
    Left unset, it is at most an eighth of the window (see ``reserve``)."""
    keep_recent: int = Field(6, ge=0)
    """Messages kept verbatim after a compaction (the split moves to keep tool pairs whole)."""
    keep_recent_tokens: int | None = Field(None, ge=0)
    """At most this many tokens kept verbatim after a compaction; default a quarter of the
    room the messages have below the threshold (so a compaction always frees a share)."""
    strategy: CompactionStrategy = "summarize"
    """``summarize`` (our summarizer), ``verbatim``, ``window`` (no model), or ``server``:
    the Messages API writes the summary (beta ``compact-2026-09-04``, an ``AnthropicModel``
    only) and the kept turns' thinking stays valid on models with preserved thinking."""
    tool_result_max_chars: int = Field(20_000, gt=0)
    """A tool result longer than this is spilled to the store; the context keeps a preview.
    The cap also never exceeds ``tool_result_max_share`` of the window."""
    tool_result_preview_chars: int = Field(2_000, ge=0)
    """Characters of a spilled result's preview; at most 40% of the effective cap."""
    tool_result_max_share: float = Field(0.15, gt=0.0, le=1.0)
    """Largest share of the window (in tokens, about 4 characters each) one inline tool
    result may take; longer ones are spilled with a preview."""
    clear_tool_results_after: int | None = Field(None, ge=0)
    """Keep only the last K tool results inline once the soft threshold is passed."""
    clear_at: float = Field(0.5, gt=0.0, le=1.0)
    """Soft threshold (fraction of ``window``) for clearing old tool results."""
    compact_ahead_at: float | None = Field(None, gt=0.0, lt=1.0)
    """Compaction ahead: from this fraction of ``window`` (below ``compact_at``) the oldest
    range is summarized in the background while the agent works, and swapped in at a call
    boundary when ready, so the agent does not wait for it at the threshold. None: off."""
    summarizer_model: str | None = None
    """Model for ``summarize`` compactions; default: the agent's own model."""
    fallback_summarizer_model: str | None = None
    max_compaction_failures: int = Field(3, gt=0)
    on_compaction_failure: Literal["fail", "continue"] = "continue"
    on_compact: Callable[..., Any] | None = None
    """Called with the messages about to be compacted; may return extra summary instructions."""
    preventive_notes: bool = True
    """Tell the model in the static prompt that old tool results may be cleared or
    summarized, so it writes down what it will need (and can recall the rest)."""
    idle_compaction: bool = True
    """Compact a conversation idle between turns before its prompt cache expires (see
    ``Runtime.compact_idle``), so the next turn does not re-send it all uncached."""
    idle_compact_after: float = Field(0.9, gt=0.0, lt=1.0)
    """Idle for this share of ``cache_ttl`` (0.9: 54 of 60 minutes) makes a session due."""
    idle_compact_min_tokens: int = Field(20_000, ge=0)
    """Contexts smaller than this are not worth an idle compaction's summary."""
    system_prompt_snapshot: bool = True
    """Build the system prompt once per run (rebuilt only after a compaction)."""
    cache_ttl: Literal["5m", "1h"] = "5m"
    """TTL of the cache breakpoints (and of the rolling one on the last message)."""
    prefix_cache_ttl: Literal["5m", "1h"] | None = None
    """TTL of the tool-list and system breakpoints; default ``cache_ttl``. With ``"1h"`` here
    and ``"5m"`` for messages the static prefix outlives idle gaps (1h entries come first)."""
    cache_breakpoints: bool = True
    """Send cache breakpoints at all (False: no prompt caching)."""

    @model_validator(mode="after")
    def _reserve_fits(self) -> ContextPolicy:
        # only a reserve the user set can be too large: the default scales (see ``reserve``)
        if "output_reserve" in self.model_fields_set and self.output_reserve >= self.window:
            raise ValueError(
                f"output_reserve ({self.output_reserve}) must be smaller than "
                f"window ({self.window})"
            )
        return self

    @model_validator(mode="after")
    def _ahead_below_threshold(self) -> ContextPolicy:
        if self.compact_ahead_at is not None and self.compact_ahead_at >= self.compact_at:
            raise ValueError(
                f"compact_ahead_at ({self.compact_ahead_at}) must be below "
                f"compact_at ({self.compact_at})"
            )
        return self

    @property
    def reserve(self) -> int:
        """Tokens kept free for the answer: ``output_reserve`` as set, or by default at most
        an eighth of the window (4,096 of a 7k window would leave no room for messages)."""
        if "output_reserve" in self.model_fields_set:
            return self.output_reserve
        return min(self.output_reserve, self.window // 8)

    @property
    def threshold(self) -> int:
        """Token count at which compaction starts."""
        return min(int(self.window * self.compact_at), self.window - self.reserve)

    @property
    def spill_chars(self) -> int:
        """Longest tool result kept inline, in characters (see ``tool_result_max_share``)."""
        share = int(self.window * self.tool_result_max_share * 4)
        return max(1, min(self.tool_result_max_chars, share))

    @property
    def preview_chars(self) -> int:
        """Characters of a spilled result's preview (see ``tool_result_preview_chars``)."""
        return min(self.tool_result_preview_chars, int(self.spill_chars * 0.4))
