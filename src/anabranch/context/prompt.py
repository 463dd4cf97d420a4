"""System-prompt assembly: ordered, deterministic blocks (static first, dynamic after)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from anabranch.context.messages import CacheTTL, SystemBlock

__all__ = ["DYNAMIC_BOUNDARY", "SubagentInfo", "assemble_system"]

DYNAMIC_BOUNDARY = "__DYNAMIC_BOUNDARY__"
"""A line in user instructions that splits the static part from the dynamic part."""


@dataclass(frozen=True)
class SubagentInfo:
    name: str
    description: str
    max_report_tokens: int


def _subagent_guidance(subagents: Sequence[SubagentInfo]) -> str:
    lines = [
        "You can delegate work to sub-agents with the spawn_agent tool. Each sub-agent works "
        "in its own context and returns only a short report. Independent sub-tasks can run "
        "in parallel: call spawn_agent several times in one turn.",
        "Available sub-agents:",
    ]
    for info in sorted(subagents, key=lambda s: s.name):
        description = info.description or "(no description)"
        lines.append(f"- {info.name}: {description}")
    return "\n".join(lines)


def assemble_system(
    *,
    instructions: str,
    subagents: Sequence[SubagentInfo] = (),
    report_cap_tokens: int | None = None,
    dynamic: Sequence[str] = (),
    cache_ttl: CacheTTL | None = "5m",
) -> tuple[SystemBlock, ...]:
    """Static block (instructions, sub-agent guidance), then a dynamic block if any.

    Each block ends with a cache breakpoint when ``cache_ttl`` is set.
    """
    static_text, _, user_dynamic = instructions.partition(DYNAMIC_BOUNDARY)
    static_parts = [static_text.strip()] if static_text.strip() else []
    if subagents:
        static_parts.append(_subagent_guidance(subagents))
    if report_cap_tokens:
        static_parts.append(
            f"When you finish, your final answer is a report for the agent that delegated to "
            f"you. Keep it under {report_cap_tokens} tokens (about {report_cap_tokens * 4} "
            f"characters); longer reports are cut."
        )
    dynamic_parts = [p.strip() for p in (user_dynamic, *dynamic) if p.strip()]
    blocks: list[SystemBlock] = []
    if static_parts:
        blocks.append(SystemBlock(text="\n\n".join(static_parts), cache=cache_ttl))
    if dynamic_parts:
        blocks.append(SystemBlock(text="\n\n".join(dynamic_parts), cache=cache_ttl))
    return tuple(blocks)
