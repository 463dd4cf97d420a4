"""System-prompt assembly: ordered, deterministic sections (static first, dynamic after).

Pure logic: file contents, the date and the working directory arrive as text; reading them
is the runtime's job. The same inputs always give byte-identical blocks, so a snapshot of the
result is a stable cache prefix.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from anabranch.messages import CacheTTL, SystemBlock

__all__ = [
    "DYNAMIC_BOUNDARY",
    "BootstrapText",
    "InstructionText",
    "MemoryIndexText",
    "MissingBootstrap",
    "PromptSection",
    "SubagentInfo",
    "assemble_system",
    "bootstrap_tag",
    "render_bootstrap",
    "render_instruction_files",
    "render_memory_index",
    "split_instructions",
    "system_sections",
]

DYNAMIC_BOUNDARY = "__DYNAMIC_BOUNDARY__"
"""A line of its own in user instructions that splits the static part from the dynamic part."""

_BOUNDARY_LINE = re.compile(rf"^[ \t]*{DYNAMIC_BOUNDARY}[ \t]*$", re.MULTILINE)
_TAG_CHARS = re.compile(r"[^a-z0-9_-]+")

MissingBootstrap = Literal["skip", "mark"]


@dataclass(frozen=True)
class SubagentInfo:
    name: str
    description: str
    max_report_tokens: int


@dataclass(frozen=True)
class BootstrapText:
    """One bootstrap file as read from the workspace; ``text`` is ``None`` when missing."""

    name: str
    """The file's path relative to the workspace, as configured (e.g. ``AGENTS.md``)."""
    text: str | None
    truncated: bool = False
    """The reader stopped early (the file is longer than the cap)."""


@dataclass(frozen=True)
class InstructionText:
    """One instruction file of one level (organization, user, project, local)."""

    level: str
    path: str
    text: str
    truncated: bool = False


@dataclass(frozen=True)
class MemoryIndexText:
    """The memory index as it enters the prompt (already capped)."""

    path: str
    text: str
    writable: bool


@dataclass(frozen=True)
class PromptSection:
    """One named part of the system prompt."""

    name: str
    text: str
    dynamic: bool = False


def split_instructions(instructions: str) -> tuple[str, str]:
    """``(static, dynamic)`` parts of user instructions, split at the first boundary line."""
    match = _BOUNDARY_LINE.search(instructions)
    if match is None:
        return instructions, ""
    return instructions[: match.start()], instructions[match.end() :]


def bootstrap_tag(name: str) -> str:
    """The XML-style tag for a bootstrap file: its lower-cased stem (``MEMORY.md`` -> memory)."""
    stem = name.replace("\\", "/").rsplit("/", 1)[-1]
    if "." in stem.lstrip("."):
        stem = stem[: stem.rindex(".")]
    tag = _TAG_CHARS.sub("_", stem.lower()).strip("_-")
    if not tag or not tag[0].isalpha():
        tag = f"file_{tag}" if tag else "file"
    return tag


def render_bootstrap(
    file: BootstrapText, *, max_chars: int, missing: MissingBootstrap = "skip"
) -> str | None:
    """A bootstrap file wrapped in its own tag, capped at ``max_chars`` with a visible marker.

    A missing file is left out (``missing="skip"``) or shown as an empty, marked tag.
    """
    tag = bootstrap_tag(file.name)
    path = file.name.replace('"', "'")
    if file.text is None:
        if missing == "skip":
            return None
        return f'<{tag} path="{path}" missing="true"></{tag}>'
    text = file.text
    if file.truncated or len(text) > max_chars:
        text = text[:max_chars].rstrip() + (
            f"\n[... truncated: only the first {max_chars} characters of {path} are shown ...]"
        )
    body = text.strip("\n")
    return f'<{tag} path="{path}">\n{body}\n</{tag}>' if body else f'<{tag} path="{path}"></{tag}>'


def render_instruction_files(files: Sequence[InstructionText], *, max_chars: int) -> str:
    """The instruction files in level order, each in a tag naming its level and path."""
    parts = [
        "Instruction files follow, from the broadest level to the most specific. Where they "
        "disagree, the later (more specific) one takes precedence."
    ]
    for file in files:
        path = file.path.replace('"', "'")
        text = file.text
        if file.truncated or len(text) > max_chars:
            text = text[:max_chars].rstrip() + (
                f"\n[... truncated: only the first {max_chars} characters of {path} are shown ...]"
            )
        parts.append(
            f'<instructions level="{file.level}" path="{path}">\n{text.strip(chr(10))}\n'
            "</instructions>"
        )
    return "\n".join(parts)


def render_memory_index(index: MemoryIndexText) -> str:
    path = index.path.replace('"', "'")
    how = (
        "Save what you learn with remember; remove what is wrong with forget."
        if index.writable
        else "This memory is read-only for you."
    )
    body = index.text.strip("\n") or "(no memories yet)"
    return (
        f'<memory_index path="{path}">\n{body}\n</memory_index>\n'
        f"This is the index of your long-term memory (one line per memory file). Memories "
        f"relevant to a task are attached to it. {how}"
    )


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


def system_sections(
    *,
    instructions: str,
    tool_guidance: Sequence[str] = (),
    subagents: Sequence[SubagentInfo] = (),
    report_cap_tokens: int | None = None,
    bootstrap: Sequence[BootstrapText] = (),
    bootstrap_max_chars: int = 20_000,
    bootstrap_missing: MissingBootstrap = "skip",
    dynamic: Sequence[str] = (),
    date: str | None = None,
    cwd: str | None = None,
    instruction_files: Sequence[InstructionText] = (),
    memory_index: MemoryIndexText | None = None,
) -> list[PromptSection]:
    """The ordered sections of a system prompt; empty sections are left out.

    Static: instructions (before a ``__DYNAMIC_BOUNDARY__`` line), tool guidance, sub-agent
    guidance, the report cap. Dynamic: instructions after the boundary, instruction files
    by level, bootstrap files (in the given order), the memory index, extra ``dynamic``
    texts, then the date and the working directory.
    """
    static_text, user_dynamic = split_instructions(instructions)
    sections = [PromptSection("instructions", static_text.strip())]
    sections += [PromptSection("tool_guidance", g.strip()) for g in tool_guidance]
    if subagents:
        sections.append(PromptSection("subagents", _subagent_guidance(subagents)))
    if report_cap_tokens:
        sections.append(
            PromptSection(
                "report_cap",
                f"When you finish, your final answer is a report for the agent that delegated "
                f"to you. Keep it under {report_cap_tokens} tokens (about "
                f"{report_cap_tokens * 4} characters); longer reports are cut.",
            )
        )
    sections.append(PromptSection("instructions_dynamic", user_dynamic.strip(), dynamic=True))
    if instruction_files:
        rendered_levels = render_instruction_files(instruction_files, max_chars=bootstrap_max_chars)
        sections.append(PromptSection("instruction_files", rendered_levels, dynamic=True))
    for file in bootstrap:
        rendered = render_bootstrap(file, max_chars=bootstrap_max_chars, missing=bootstrap_missing)
        if rendered is not None:
            sections.append(PromptSection(f"bootstrap:{file.name}", rendered, dynamic=True))
    if memory_index is not None:
        sections.append(PromptSection("memory_index", render_memory_index(memory_index), True))
    sections += [PromptSection("dynamic", text.strip(), dynamic=True) for text in dynamic]
    if date:
        sections.append(PromptSection("date", f"Current date: {date}", dynamic=True))
    if cwd:
        sections.append(PromptSection("cwd", f"Working directory: {cwd}", dynamic=True))
    return [s for s in sections if s.text]


def assemble_system(
    *,
    instructions: str,
    subagents: Sequence[SubagentInfo] = (),
    report_cap_tokens: int | None = None,
    dynamic: Sequence[str] = (),
    cache_ttl: CacheTTL | None = "5m",
    tool_guidance: Sequence[str] = (),
    bootstrap: Sequence[BootstrapText] = (),
    bootstrap_max_chars: int = 20_000,
    bootstrap_missing: MissingBootstrap = "skip",
    date: str | None = None,
    cwd: str | None = None,
    instruction_files: Sequence[InstructionText] = (),
    memory_index: MemoryIndexText | None = None,
) -> tuple[SystemBlock, ...]:
    """At most two blocks: the static sections, then the dynamic ones (see ``system_sections``).

    Each block ends with a cache breakpoint when ``cache_ttl`` is set (the runtime places
    the final breakpoints per request; see ``anabranch.context._cache``).
    """
    sections = system_sections(
        instructions=instructions,
        tool_guidance=tool_guidance,
        subagents=subagents,
        report_cap_tokens=report_cap_tokens,
        bootstrap=bootstrap,
        bootstrap_max_chars=bootstrap_max_chars,
        bootstrap_missing=bootstrap_missing,
        dynamic=dynamic,
        date=date,
        cwd=cwd,
        instruction_files=instruction_files,
        memory_index=memory_index,
    )
    static = [s.text for s in sections if not s.dynamic]
    volatile = [s.text for s in sections if s.dynamic]
    blocks: list[SystemBlock] = []
    if static:
        blocks.append(SystemBlock(text="\n\n".join(static), cache=cache_ttl))
    if volatile:
        blocks.append(SystemBlock(text="\n\n".join(volatile), cache=cache_ttl))
    return tuple(blocks)
