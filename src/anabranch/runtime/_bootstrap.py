"""Reads what the dynamic part of the system prompt is made of: workspace files, date, cwd.

The only I/O of prompt assembly; ``anabranch.context._prompt`` gets the texts. It runs when a
snapshot is built (start of a run, after a compaction), never for a call that reuses one.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from dataclasses import dataclass

from anabranch.agents import Agent
from anabranch.context._prompt import BootstrapText

__all__ = ["PromptInputs", "now", "prompt_inputs", "read_bootstrap"]

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


@dataclass(frozen=True)
class PromptInputs:
    """Everything outside the agent definition that enters its system prompt."""

    bootstrap: list[BootstrapText]
    date: str | None
    cwd: str | None


def prompt_inputs(agent: Agent) -> PromptInputs:
    """Read the bootstrap files, and the date and working directory if the agent wants them."""
    return PromptInputs(
        bootstrap=read_bootstrap(agent),
        date=now().strftime(agent.date_format) if agent.include_date else None,
        cwd=os.getcwd() if agent.include_cwd else None,
    )
