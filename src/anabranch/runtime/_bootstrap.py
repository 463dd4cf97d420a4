"""Reads what the dynamic part of the system prompt is made of: workspace files, date, cwd.

The only I/O of prompt assembly; ``anabranch.context._prompt`` gets the texts. It runs when a
snapshot is built (start of a run, after a compaction), never for a call that reuses one.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from dataclasses import dataclass, field

from anabranch.agents import Agent
from anabranch.context._prompt import BootstrapText, InstructionText, MemoryIndexText
from anabranch.memory._files import MemoryFolder
from anabranch.memory._index import capped_index

__all__ = [
    "PromptInputs",
    "now",
    "prompt_inputs",
    "read_bootstrap",
    "read_instruction_files",
    "read_memory_index",
]

_log = logging.getLogger(__name__)


def now() -> dt.datetime:
    """The local time used for the date in system prompts (patched in tests)."""
    return dt.datetime.now().astimezone()


def read_bootstrap(agent: Agent) -> list[BootstrapText]:
    """The agent's bootstrap files, in order; a missing or unreadable one has ``text=None``.

    At most ``bootstrap_max_chars + 1`` characters of each are read (the extra one tells
    that the file was cut). Invalid UTF-8 is replaced, newlines are normalised.
    """
    if agent.workspace is None:
        return []
    root = agent.workspace.expanduser()
    files = []
    for name in agent.bootstrap_files:
        path = root / name
        try:
            with path.open(encoding="utf-8", errors="replace") as handle:
                text: str | None = handle.read(agent.bootstrap_max_chars + 1)
        except FileNotFoundError:
            text = None
        except OSError as exc:
            _log.warning("bootstrap file %s cannot be read: %s", path, exc)
            text = None
        truncated = text is not None and len(text) > agent.bootstrap_max_chars
        files.append(BootstrapText(name=name, text=text, truncated=truncated))
    return files


def read_instruction_files(agent: Agent) -> list[InstructionText]:
    """The agent's instruction files that exist, in level order (capped like bootstrap
    files; unreadable ones are skipped with a warning)."""
    files = []
    for level in agent.instruction_files:
        path = level.path.expanduser()
        try:
            with path.open(encoding="utf-8", errors="replace") as handle:
                text = handle.read(agent.bootstrap_max_chars + 1)
        except FileNotFoundError:
            continue
        except OSError as exc:
            _log.warning("instruction file %s cannot be read: %s", path, exc)
            continue
        truncated = len(text) > agent.bootstrap_max_chars
        files.append(InstructionText(level.level, str(path), text, truncated))
    return files


def read_memory_index(agent: Agent) -> MemoryIndexText | None:
    """The agent's ``MEMORY.md`` index, capped, or ``None`` without memory (or when the
    memory is only inherited read-only from a parent: then it has no index in its prompt)."""
    memory = agent.memory
    if memory is None or not memory.index_in_prompt:
        return None
    folder = MemoryFolder(memory.folder(agent.name))
    index = folder.index_text() or ""
    view = capped_index(index, max_lines=memory.index_max_lines, max_bytes=memory.index_max_bytes)
    return MemoryIndexText(
        path=str(folder.root / "MEMORY.md"), text=view.text, writable=not memory.read_only
    )


@dataclass(frozen=True)
class PromptInputs:
    """Everything outside the agent definition that enters its system prompt."""

    bootstrap: list[BootstrapText]
    date: str | None
    cwd: str | None
    instruction_files: list[InstructionText] = field(default_factory=list)
    memory_index: MemoryIndexText | None = None


def prompt_inputs(agent: Agent) -> PromptInputs:
    """Read the bootstrap files, and the date and working directory if the agent wants them."""
    return PromptInputs(
        bootstrap=read_bootstrap(agent),
        date=now().strftime(agent.date_format) if agent.include_date else None,
        cwd=os.getcwd() if agent.include_cwd else None,
        instruction_files=read_instruction_files(agent),
        memory_index=read_memory_index(agent),
    )
