"""The request parameters of the local server beyond messages: sampling, thinking (with
its block binding), tool choice, compaction on demand, cache diagnostics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from anabranch.testing._wire_shape import as_dict as _dict
from anabranch.testing._wire_shape import as_str as _str
from anabranch.testing._wire_shape import fail as _fail
from anabranch.testing._wire_shape import no_extra as _no_extra
from anabranch.testing._wire_shape import required as _required

__all__ = [
    "Thinking",
    "compaction_param",
    "diagnostics_param",
    "number_param",
    "thinking_param",
    "tool_choice_param",
]


def number_param(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        _fail(key, "Input should be a valid number")
    if not low <= value <= high:
        _fail(key, f"Input should be between {low:g} and {high:g}")
    return float(value)


@dataclass(frozen=True)
class Thinking:
    """The ``thinking`` parameter as sent: its type (``None`` when absent), the budget of
    ``enabled``, and what a prefix-bound block that fails its check does."""

    kind: str | None = None
    budget: int | None = None
    drop_mismatched: bool = False


def _block_binding(obj: dict[str, Any], path: str) -> bool:
    raw = obj.get("block_binding")
    if raw is None:
        return False
    binding = _dict(raw, f"{path}.block_binding")
    _no_extra(binding, frozenset({"prefix_mismatch_behavior"}), f"{path}.block_binding")
    behavior = binding.get("prefix_mismatch_behavior")
    if behavior not in (None, "error", "drop_block"):
        _fail(
            f"{path}.block_binding.prefix_mismatch_behavior",
            "Input should be 'error' or 'drop_block'",
        )
    return behavior == "drop_block"


def thinking_param(raw: Any) -> Thinking:
    if raw is None:
        return Thinking()
    obj = _dict(raw, "thinking")
    kind = obj.get("type")
    if kind == "disabled":
        _no_extra(obj, frozenset({"type"}), "thinking.disabled")
        return Thinking(kind="disabled")
    if kind == "adaptive":
        _no_extra(obj, frozenset({"type", "display", "block_binding"}), "thinking.adaptive")
        if obj.get("display") not in (None, "summarized", "omitted", "updates"):
            _fail(
                "thinking.adaptive.display", "Input should be 'summarized', 'omitted' or 'updates'"
            )
        return Thinking(kind="adaptive", drop_mismatched=_block_binding(obj, "thinking.adaptive"))
    if kind != "enabled":
        _fail("thinking.type", "Input should be 'enabled', 'disabled' or 'adaptive'")
    allowed = frozenset({"type", "budget_tokens", "display", "block_binding"})
    _no_extra(obj, allowed, "thinking.enabled")
    budget = _required(obj, "budget_tokens", "thinking.enabled")
    if not isinstance(budget, int) or isinstance(budget, bool):
        _fail("thinking.enabled.budget_tokens", "Input should be a valid integer")
    if budget < 1024:
        _fail("thinking.enabled.budget_tokens", "Input should be greater than or equal to 1024")
    drop = _block_binding(obj, "thinking.enabled")
    return Thinking(kind="enabled", budget=budget, drop_mismatched=drop)


def tool_choice_param(raw: Any) -> str | None:
    if raw is None:
        return None
    obj = _dict(raw, "tool_choice")
    kind = obj.get("type")
    if kind in ("auto", "any", "none"):
        _no_extra(obj, frozenset({"type", "disable_parallel_tool_use"}), f"tool_choice.{kind}")
        return str(kind)
    if kind == "tool":
        _no_extra(obj, frozenset({"type", "name", "disable_parallel_tool_use"}), "tool_choice.tool")
        return _str(_required(obj, "name", "tool_choice.tool"), "tool_choice.tool.name")
    _fail("tool_choice.type", "Input should be 'auto', 'any', 'tool' or 'none'")


def compaction_param(raw: Any) -> tuple[bool, str | None]:
    """The ``compaction`` parameter: (asked, the instructions replacing the server's)."""
    if raw is None:
        return False, None
    obj = _dict(raw, "compaction")
    if obj.get("type") != "summarize":
        _fail("compaction.type", "Input should be 'summarize'")
    _no_extra(obj, frozenset({"type", "instructions"}), "compaction")
    instructions = obj.get("instructions")
    if instructions is not None:
        instructions = _str(instructions, "compaction.instructions").strip() or None
    return True, instructions


def diagnostics_param(raw: Any) -> tuple[bool, str | None]:
    if raw is None:
        return False, None
    obj = _dict(raw, "diagnostics")
    _no_extra(obj, frozenset({"previous_message_id"}), "diagnostics")
    previous = obj.get("previous_message_id")
    return True, None if previous is None else _str(previous, "diagnostics.previous_message_id")
