"""What each Claude model family accepts for thinking, and whether it binds thinking
blocks to the prompt prefix they were produced after ("preserved thinking").

One table, read by ``ModelSettings``/``Agent`` validation, the runtime's request view and
the local server, so the three agree. Facts from the platform documentation (adaptive
thinking, the Opus 5.5 / Fable 5.1 release notes, preserved thinking) and the errors the
API is quoted returning; a model id this table does not know is treated leniently
(every mode accepted, no binding), since it may be a gateway alias or a test name.
"""

from __future__ import annotations

import re
from typing import Literal

__all__ = [
    "ThinkingMode",
    "accepts_thinking_mode",
    "family",
    "prefix_bound",
    "thinking_always_on",
]

ThinkingMode = Literal["enabled", "adaptive"]

_ADAPTIVE_ONLY = (
    "claude-opus-5-5", "claude-fable-5-2", "claude-fable-5-1", "claude-mythos-5-2",
    "claude-mythos-5-1", "claude-fable-5", "claude-mythos-5", "claude-mythos-preview",
    "claude-opus-5", "claude-sonnet-5", "claude-opus-4-8", "claude-opus-4-7",
)  # fmt: skip
"""``thinking.type: "enabled"`` (a budget) is refused: ``"thinking.type.enabled" is not
supported for this model``. ``claude-sonnet-5`` here is the 5.0 id only (see ``family``)."""
_BOTH = ("claude-opus-4-6", "claude-sonnet-4-6", "claude-sonnet-5-5", "claude-haiku-5-5")
"""Adaptive and a fixed budget both accepted (5.5 Sonnet/Haiku: no page says a budget is
refused; treated as accepting both)."""
_ENABLED_ONLY = (
    "claude-opus-4-5", "claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-1",
    "claude-opus-4", "claude-sonnet-4", "claude-3",
)  # fmt: skip
"""``adaptive thinking is not supported on this model``."""
_ALWAYS_ON = (
    "claude-opus-5-5", "claude-fable-5-2", "claude-fable-5-1", "claude-mythos-5-2",
    "claude-mythos-5-1", "claude-fable-5", "claude-mythos-5", "claude-mythos-preview",
)  # fmt: skip
"""Thinking cannot be disabled (omitted means adaptive) and forced tool use is refused."""
_PREFIX_BOUND = (
    "claude-fable-5-2", "claude-mythos-5-2", "claude-fable-5-1", "claude-mythos-5-1",
    "claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-5-5",
)  # fmt: skip
"""Preserved thinking: a replayed thinking block whose prefix (system, tools, every
earlier message) changed since it was produced is refused (400) or dropped."""

_KNOWN = sorted({*_ADAPTIVE_ONLY, *_BOTH, *_ENABLED_ONLY}, key=len, reverse=True)
_PROVIDER = re.compile(r"^(?:[a-z0-9-]+[./])?(?=claude-)")


def family(model: str) -> str | None:
    """The family id of ``model`` (``claude-opus-5-5-20260915`` -> ``claude-opus-5-5``;
    a ``provider/`` or ``provider.`` prefix is ignored), or ``None`` when unknown."""
    name = _PROVIDER.sub("", model.strip().lower())
    for known in _KNOWN:
        if name == known or name.startswith(known + "-") or name.startswith(known + "@"):
            rest = name[len(known) :].lstrip("-@")
            # ``claude-sonnet-5`` must not swallow ``claude-sonnet-5-5``: a longer known id
            # was tried first, so what is left here is a date or a version tag
            if rest[:1].isdigit() and len(rest) < 3:
                continue
            return known
    return None


def accepts_thinking_mode(model: str, mode: ThinkingMode) -> bool:
    known = family(model)
    if known is None:
        return True
    if mode == "enabled":
        return known not in _ADAPTIVE_ONLY
    return known not in _ENABLED_ONLY


def thinking_always_on(model: str) -> bool:
    return family(model) in _ALWAYS_ON


def prefix_bound(model: str) -> bool:
    return family(model) in _PREFIX_BOUND
