"""``Memory``: where an agent keeps what it learns across sessions (pure configuration)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "MEMORY_TYPES",
    "InstructionLevel",
    "Memory",
    "MemoryScope",
    "MemoryType",
    "standard_instruction_files",
]

MemoryType = Literal["user", "feedback", "project", "reference"]
MEMORY_TYPES: tuple[MemoryType, ...] = ("user", "feedback", "project", "reference")
MemoryScope = Literal["shared", "agent"]


class Memory(BaseModel):
    """Long-term memory in a folder of Markdown files with a ``MEMORY.md`` index.

    ``scope="shared"``: every agent using ``dir`` reads and writes the same memories;
    ``scope="agent"``: each agent name has its own subfolder of ``dir``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    dir: Path
    scope: MemoryScope = "shared"
    read_only: bool = False
    """Offer no ``remember``/``forget``/``log`` tools; the memories are still read."""
    index_max_lines: int = Field(200, gt=0)
    index_max_bytes: int = Field(25_000, gt=0)
    """The index enters the prompt up to whichever cap comes first, with a visible marker."""
    max_file_chars: int = Field(20_000, gt=0)
    """The most characters one memory's content may have."""
    max_memories: int = Field(1_000, gt=0)
    """The most memory files the folder may hold; a write past it is refused."""
    select: int = Field(5, ge=0)
    """Memories attached to a run's first turn, and again after each compaction (0: none)."""
    select_candidates: int = Field(200, gt=0)
    """How many of the most recently changed memories are considered."""
    select_model: str | None = None
    """A cheap model that picks the relevant memories; ``None``: keyword overlap only."""
    log: bool = False
    """Offer the ``log`` tool: append-only notes in ``logs/YYYY/MM/YYYY-MM-DD.md``."""
    index_in_prompt: bool = True
    """Show the ``MEMORY.md`` index in the system prompt (off for memory a sub-agent
    only inherits read-only from its parent)."""
    children: Literal["read", "none"] = "read"
    """A sub-agent without its own ``memory=`` reads this one read-only, or nothing."""
    retention_days: int | None = Field(None, gt=0)
    """Consolidation prunes memories not updated for this many days (``None``: keep all)."""
    auto_consolidate: bool = False
    """Consolidate at session start when 24 hours and 5 sessions have passed since the last."""
    consolidate_model: str | None = None
    """A model that merges overlapping memories and distills the logs when consolidating
    (``None``: the deterministic merge; also the fallback when the model call fails)."""
    extract_before_compaction: bool = False
    """Before a range of the context is summarized, one call of ``extract_model`` reads it
    with the memory guidance and saves the durable facts it holds as memories (off by
    default: it costs one more model call per compaction and writes files nobody asked
    for; turn it on for long sessions whose early turns teach things worth keeping)."""
    extract_model: str | None = None
    """The model that extracts memories before a compaction (``None``: the summarizer's)."""
    reselect_after_compaction: bool = True
    """After each compaction, choose relevant memories again (skipping those already
    surfaced in the run) and attach them after the summary."""

    @model_validator(mode="after")
    def _dir_is_a_folder_path(self) -> Memory:
        if not str(self.dir).strip():
            raise ValueError("memory dir must be a folder path")
        return self

    def folder(self, agent_name: str) -> Path:
        """The folder this agent's memories live in."""
        root = self.dir.expanduser()
        return root / agent_name if self.scope == "agent" else root


InstructionLevelName = Literal["organization", "user", "project", "local"]


class InstructionLevel(BaseModel):
    """One instruction file at one level (the CLAUDE.md order: later levels take precedence)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    level: InstructionLevelName
    path: Path


def standard_instruction_files(
    project: Path, *, name: str = "AGENTS.md", user_dir: Path | None = None
) -> tuple[InstructionLevel, ...]:
    """The usual four levels: ``/etc/anabranch/NAME`` (organization),
    ``~/.config/anabranch/NAME`` (user), ``PROJECT/NAME`` (project) and
    ``PROJECT/NAME`` with ``.local`` before the suffix (local, kept out of git)."""
    stem, dot, suffix = name.rpartition(".")
    local = f"{stem}.local.{suffix}" if dot else f"{name}.local"
    user = user_dir if user_dir is not None else Path("~/.config/anabranch")
    return (
        InstructionLevel(level="organization", path=Path("/etc/anabranch") / name),
        InstructionLevel(level="user", path=user / name),
        InstructionLevel(level="project", path=project / name),
        InstructionLevel(level="local", path=project / local),
    )
