"""``ModelSettings``: the per-agent request settings (thinking, sampling, tool choice,
service tier, extra headers and body), checked at definition against what the API refuses."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from anabranch._text import canonical_json
from anabranch._thinking_models import ThinkingMode

__all__ = ["MIN_THINKING_BUDGET", "ModelSettings", "ThinkingMode", "ToolChoice"]


ToolChoice = str
"""``"auto"``, ``"any"``, ``"none"`` or the name of one tool."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


MIN_THINKING_BUDGET = 1024
"""The API's smallest ``budget_tokens``."""


class ModelSettings(_Frozen):
    """How the model is asked to answer: extended thinking, sampling, tool choice, tier.

    Checked at definition against what the Messages API refuses together: thinking with a
    modified ``temperature`` or ``top_k`` (``top_p`` only within 0.95..1) or with forced
    tool use (``tool_choice`` ``"any"`` or a tool name). ``max_tokens`` must exceed
    ``thinking_budget``; the ``Agent`` checks that, since it owns ``max_tokens``.
    """

    thinking: ThinkingMode | None = None
    """``"adaptive"``: the model decides when and how much to think (the only mode some
    models accept); ``"enabled"``: a fixed ``thinking_budget`` (set by giving one);
    ``None`` (default): off, or the model's own default where thinking cannot be off."""
    thinking_budget: int | None = Field(None, ge=MIN_THINKING_BUDGET)
    """Extended thinking on with this many tokens to think in; ``None`` (default): off."""
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, gt=0)
    stop_sequences: tuple[str, ...] = ()
    tool_choice: ToolChoice | None = None
    """``"auto"`` | ``"any"`` | ``"none"`` | a tool name; ``None``: the API's default."""
    service_tier: Literal["auto", "standard_only"] | None = None
    extra_headers: dict[str, str] = Field(default_factory=dict)
    """Sent with every request (e.g. a beta header); never stored or traced by value."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Merged into every request body, for API fields this model does not name."""
    cache_diagnostics: bool = False
    """Ask the API why a call's prompt diverged from the run's previous one
    (``diagnostics.previous_message_id``): the answer becomes the cache-break cause."""

    @field_validator("stop_sequences")
    @classmethod
    def _non_blank(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not s.strip() for s in value):
            raise ValueError("stop sequences must contain non-whitespace text")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _choice(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("tool_choice must be 'auto', 'any', 'none' or a tool name")
        return value

    @model_validator(mode="before")
    @classmethod
    def _mode_from_budget(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("thinking_budget") is not None:
            mode = data.get("thinking")
            if mode == "adaptive":
                raise ValueError(
                    "thinking='adaptive' takes no thinking_budget: the model decides how much "
                    "to think (drop thinking_budget, or use thinking='enabled' with it)"
                )
            if mode is None:
                data = {**data, "thinking": "enabled"}
        return data

    @model_validator(mode="after")
    def _compatible(self) -> ModelSettings:
        if self.thinking == "enabled" and self.thinking_budget is None:
            raise ValueError("thinking='enabled' needs a thinking_budget (at least 1024 tokens)")
        if self.thinking is None:
            return self
        what = "thinking_budget" if self.thinking == "enabled" else "thinking='adaptive'"
        if self.temperature is not None and self.temperature != 1.0:
            raise ValueError(
                f"{what} cannot be combined with temperature (the API allows only "
                "temperature=1 when thinking is enabled)"
            )
        if self.top_k is not None:
            raise ValueError(f"{what} cannot be combined with top_k")
        if self.top_p is not None and self.top_p < 0.95:
            raise ValueError(f"with {what}, top_p must be between 0.95 and 1")
        if self.forces_tool_use:
            raise ValueError(
                f"{what} cannot be combined with tool_choice={self.tool_choice!r}: "
                "thinking may not be enabled when tool_choice forces tool use "
                "(use 'auto' or 'none')"
            )
        return self

    @property
    def forces_tool_use(self) -> bool:
        return self.tool_choice is not None and self.tool_choice not in ("auto", "none")

    def is_default(self) -> bool:
        if self.__class__ is ModelSettings and self.__dict__ == _DEFAULT_SETTINGS.__dict__:
            return True  # pydantic's own equality in its first test (asked at every call)
        return self == _DEFAULT_SETTINGS

    def cache_key(self) -> str:
        """What of these settings keys the messages part of the prompt cache."""
        if self.thinking == "adaptive":
            return canonical_json(["adaptive", self.tool_choice])
        if self.thinking_budget is None and self.tool_choice is None:
            return "[null,null]"  # the usual key (one per model call), as canonical_json has it
        return canonical_json([self.thinking_budget, self.tool_choice])

    def without_thinking(self) -> ModelSettings:
        return self.model_copy(update={"thinking": None, "thinking_budget": None})


_DEFAULT_SETTINGS = ModelSettings()
