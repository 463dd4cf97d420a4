"""A run whose model changed (definition edited, session resumed or continued with another
model): the model that served its context so far summarizes it first, if the new one's
window cannot hold it.

The previous model read this context whole at its last call, so it can also read it for a
summary (in one request, and from its own prompt cache); the new model, with a smaller
window, would have to summarize in parts or be refused. The boundary records who
summarized and why (``extra.model_switch``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from anabranch.store import CallRecord, RunRecord

__all__ = ["ModelSwitch", "model_switch", "same_model", "served_model"]


def same_model(requested: str, served: str | None) -> bool:
    """Whether ``served`` (a response's model) is ``requested``: an alias is answered with
    its dated id (``claude-x`` -> ``claude-x-20250101``)."""
    if served is None or served == requested:
        return True
    return served.startswith(requested + "-") or requested.startswith(served + "-")


def served_model(record: RunRecord, last_ok: CallRecord | None) -> str | None:
    """The model that served the run's latest response, as it was requested when the
    response says the run's own model (so an alias stays an alias); ``None``: no call yet."""
    if last_ok is None:
        return None
    if same_model(record.model, last_ok.model):
        return record.model
    return last_ok.model


@dataclass(frozen=True)
class ModelSwitch:
    """The run's context was served by ``previous`` and must now fit ``current``."""

    previous: str
    current: str
    tokens: int
    threshold: int
    window: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "from": self.previous,
            "to": self.current,
            "summarizer": self.previous,
            "reason": (
                f"the model changed from {self.previous} to {self.current}, whose window "
                f"({self.window} tokens) cannot hold the context ({self.tokens} tokens, "
                f"threshold {self.threshold}): the previous model summarized it"
            ),
        }


def model_switch(
    previous: str | None, current: str, tokens: int, threshold: int, window: int
) -> ModelSwitch | None:
    """A switch that needs the previous model's summary: the model changed and the context
    is at or above the new model's threshold."""
    if previous is None or same_model(current, previous) or tokens < threshold:
        return None
    return ModelSwitch(previous, current, tokens, threshold, window)
