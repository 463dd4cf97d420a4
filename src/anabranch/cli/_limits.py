"""``anabranch show``: which context window each run had, and where it came from."""

from __future__ import annotations

from typing import Any

from anabranch.runtime._history import session_outline
from anabranch.store import ContextLimitRecord, SessionRecord

__all__ = ["declared_windows", "window_labels"]


def declared_windows(session: SessionRecord) -> dict[str, int]:
    """Agent name -> the window its definition declared (from the session's outline)."""
    windows: dict[str, int] = {}
    if not session.definition:
        return windows

    def walk(node: Any) -> None:
        if not isinstance(node, dict):
            return
        name = node.get("agent", node.get("name"))  # a graph task names its agent
        if isinstance(name, str) and isinstance(node.get("window"), int):
            windows.setdefault(name, node["window"])
        for key in ("subagents", "tasks"):
            for child in node.get(key) or ():
                walk(child)

    walk(session_outline(session))
    return windows


def _label(record: ContextLimitRecord) -> str:
    how = f"{record.source} from {record.channel}"
    if record.ratio > 1.0:
        how += f": {record.maximum:,} by its count, x{record.ratio:.2f} ours"
    return f"window={record.window:,} ({how})"


def window_labels(
    runs: dict[str, str], limits: list[ContextLimitRecord], declared: dict[str, int]
) -> dict[str, str]:
    """Run id -> ``window=N (source ...)`` for the runs in ``runs`` (id -> agent name)."""
    latest: dict[str, ContextLimitRecord] = {}
    for record in limits:
        if record.run_id is not None:
            known = latest.get(record.run_id)
            if known is None or record.window <= known.window:
                latest[record.run_id] = record
    labels: dict[str, str] = {}
    for run_id, agent in runs.items():
        if run_id in latest:
            labels[run_id] = _label(latest[run_id])
        elif agent in declared:
            labels[run_id] = f"window={declared[agent]:,} (declared)"
    return labels
