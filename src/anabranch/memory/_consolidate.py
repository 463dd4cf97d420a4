"""Consolidation: merge overlapping memories (newest wins), distill the daily logs into
topic memories, prune what is past its retention age, and record what changed.

Deterministic (no model): overlap is word overlap within one memory type; a merged memory
keeps the newest one's name, description and content and adds the older ones' lines it
does not already hold under a marked "earlier" heading, so nothing is silently lost. The
daily logs are append-only and never edited: each month's entries become one ``project``
memory (``log-YYYY-MM``), and the log files consolidated are remembered in the state file.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from anabranch.memory._files import MemoryFile, MemoryFolder, atomic_write, now_iso

__all__ = [
    "ConsolidationReport",
    "consolidate",
    "consolidation_due",
    "finish",
    "note_session",
    "pending_logs",
    "read_state",
]

STATE_FILE = ".consolidation.json"
LOG_DIR = "logs"
_WORD = re.compile(r"[a-z0-9]{3,}")
_MARKER = re.compile(r"\s*<!--.*?-->")
OVERLAP = 0.5
"""Jaccard overlap of two memories' words (same type) from which they are one memory."""
DUE_HOURS = 24
DUE_SESSIONS = 5


@dataclass
class ConsolidationReport:
    merged: list[tuple[str, list[str]]] = field(default_factory=list)
    """(kept name, names merged into it)."""
    distilled: list[str] = field(default_factory=list)
    """Memories written from the daily logs."""
    pruned: list[str] = field(default_factory=list)
    when: str = ""
    method: str = "deterministic"
    """``model <name>``, ``deterministic``, or ``deterministic (model <name> failed: …)``."""

    @property
    def changed(self) -> bool:
        return bool(self.merged or self.distilled or self.pruned)

    def summary(self) -> str:
        lines = [f"Consolidation at {self.when} ({self.method}):"]
        for kept, others in self.merged:
            lines.append(f"- merged {', '.join(others)} into {kept} (newest wins)")
        lines += [f"- distilled the daily logs into {name}" for name in self.distilled]
        lines += [f"- pruned {name} (past the retention age)" for name in self.pruned]
        if not self.changed:
            lines.append("- nothing to change")
        return "\n".join(lines)


def _words(memory: MemoryFile) -> set[str]:
    return set(_WORD.findall(f"{memory.description} {memory.content}".lower()))


def _overlap(a: MemoryFile, b: MemoryFile) -> float:
    wa, wb = _words(a), _words(b)
    return len(wa & wb) / len(wa | wb) if wa and wb else 0.0


def _merge(newest: MemoryFile, older: list[MemoryFile]) -> MemoryFile:
    have = {line.strip() for line in newest.content.splitlines() if line.strip()}
    extra: list[str] = []
    for memory in older:
        fresh = [
            line
            for line in memory.content.splitlines()
            if line.strip() and line.strip() not in have
        ]
        if fresh:
            extra.append(f"From {memory.name} (updated {memory.updated}):")
            extra += fresh
            have.update(line.strip() for line in fresh)
    content = newest.content
    if extra:
        content += (
            "\n\n## Earlier notes (merged; where they disagree with the above, the above is "
            "newer and wins)\n" + "\n".join(extra)
        )
    created = min([newest.created, *(m.created for m in older)])
    return MemoryFile(
        name=newest.name,
        description=newest.description,
        type=newest.type,
        content=content,
        created=created,
        updated=now_iso(),
        source=newest.source,
    )


def read_state(root: Path) -> dict[str, object]:
    try:
        state = json.loads((root / STATE_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return {}
    return state if isinstance(state, dict) else {}


def _write_state(root: Path, state: dict[str, object]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    atomic_write(root / STATE_FILE, json.dumps(state, indent=1, sort_keys=True) + "\n")


def note_session(root: Path) -> None:
    """Count one more session since the last consolidation."""
    folder = MemoryFolder(root)
    with folder.locked():
        state = read_state(root)
        count = state.get("sessions_since", 0)
        state["sessions_since"] = (count if isinstance(count, int) else 0) + 1
        _write_state(root, state)


def consolidation_due(root: Path, *, now: dt.datetime | None = None) -> bool:
    """At least 24 hours and 5 sessions since the last consolidation (or none yet and 5
    sessions)."""
    state = read_state(root)
    sessions = state.get("sessions_since", 0)
    if not isinstance(sessions, int) or sessions < DUE_SESSIONS:
        return False
    last = state.get("last_run")
    if not isinstance(last, str):
        return True
    moment = now or dt.datetime.now(dt.UTC)
    try:
        previous = dt.datetime.fromisoformat(last)
    except ValueError:
        return True
    return moment - previous >= dt.timedelta(hours=DUE_HOURS)


def _log_files(root: Path) -> list[Path]:
    logs = root / LOG_DIR
    if not logs.is_dir():
        return []
    return sorted(
        p for p in logs.glob("*/*/*.md") if re.fullmatch(r"\d{4}-\d{2}-\d{2}\.md", p.name)
    )


def pending_logs(
    folder: MemoryFolder, state: dict[str, object], today: dt.date
) -> tuple[dict[str, list[str]], list[str]]:
    """The entries of every finished daily log not consolidated yet, by day, and the logs'
    keys (today's log is still being written: it waits)."""
    done = state.get("logs_done", [])
    seen = set(done) if isinstance(done, list) else set()
    by_day: dict[str, list[str]] = {}
    consumed: list[str] = []
    for path in _log_files(folder.root):
        key = path.relative_to(folder.root).as_posix()
        if key in seen or path.stem >= today.isoformat():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        by_day[path.stem] = [
            _MARKER.sub("", line.strip())
            for line in text.splitlines()
            if line.strip().startswith("- ")
        ]
        consumed.append(key)
    return by_day, consumed


def _distill_logs(folder: MemoryFolder, by_day: dict[str, list[str]]) -> list[MemoryFile]:
    by_month: dict[str, list[str]] = {}
    for day, entries in sorted(by_day.items()):
        by_month.setdefault(day[:7], []).extend(f"{e} ({day})" for e in entries)
    written: list[MemoryFile] = []
    for month, entries in sorted(by_month.items()):
        name = f"log-{month}"
        previous = folder.read(name)
        lines = previous.content.splitlines() if previous else []
        lines += [e for e in dict.fromkeys(entries) if e not in lines]
        stamp = now_iso()
        written.append(
            MemoryFile(
                name=name,
                description=f"What was logged in {month} (distilled from the daily logs)",
                type="project",
                content="\n".join(lines),
                created=previous.created if previous else stamp,
                updated=stamp,
            )
        )
    return written


def consolidate(
    root: Path,
    *,
    retention_days: int | None = None,
    now: dt.datetime | None = None,
    method: str = "deterministic",
) -> ConsolidationReport:
    """Consolidate the memories in ``root`` without a model (blocking; call from a worker
    thread). See ``consolidate_with_model`` for the model-written merge."""
    moment = now or dt.datetime.now(dt.UTC)
    folder = MemoryFolder(root)
    report = ConsolidationReport(when=moment.replace(microsecond=0).isoformat(), method=method)
    memories = folder.all()  # newest first
    removed: list[str] = []
    writes: list[MemoryFile] = []
    used: set[str] = set()
    for i, newest in enumerate(memories):
        if newest.name in used:
            continue
        group = [
            other
            for other in memories[i + 1 :]
            if other.name not in used
            and other.type == newest.type
            and _overlap(newest, other) >= OVERLAP
        ]
        if group:
            used.update(m.name for m in group)
            writes.append(_merge(newest, group))
            removed += [m.name for m in group]
            report.merged.append((newest.name, [m.name for m in group]))
        used.add(newest.name)
    state = read_state(root)
    by_day, consumed = pending_logs(folder, state, moment.date())
    distilled = _distill_logs(folder, by_day)
    writes += distilled
    report.distilled = [m.name for m in distilled]
    finish(folder, report, writes, removed, consumed, retention_days=retention_days, now=moment)
    return report


def finish(
    folder: MemoryFolder,
    report: ConsolidationReport,
    writes: list[MemoryFile],
    removed: list[str],
    consumed: list[str],
    *,
    retention_days: int | None,
    now: dt.datetime,
    archive: list[MemoryFile] | None = None,
) -> None:
    """Prune past the retention age, write and remove in one locked step, then record the
    run: the state (logs consumed, when) and the summary in ``logs/consolidations.md``.
    ``archive``: originals a model rewrote, kept under ``logs/archive/`` (never lost)."""
    root = folder.root
    removed = list(removed)
    if retention_days is not None:
        cutoff = now - dt.timedelta(days=retention_days)
        written = {w.name for w in writes}
        for memory in folder.all():
            if memory.name in removed or memory.name in written:
                continue
            try:
                updated = dt.datetime.fromisoformat(memory.updated)
            except ValueError:
                continue
            if updated.tzinfo is None:
                updated = updated.replace(tzinfo=dt.UTC)
            if updated < cutoff:
                removed.append(memory.name)
                report.pruned.append(memory.name)
    if archive:
        shelf = root / LOG_DIR / "archive" / now.strftime("%Y-%m-%dT%H%M%S")
        shelf.mkdir(parents=True, exist_ok=True)
        for memory in archive:
            atomic_write(shelf / memory.filename, memory.render())
    folder.replace_all(writes, [n for n in removed if n not in {w.name for w in writes}])
    state = read_state(root)
    done = state.get("logs_done", [])
    state["logs_done"] = sorted({*(done if isinstance(done, list) else []), *consumed})
    state["last_run"] = report.when
    state["sessions_since"] = 0
    with folder.locked():
        _write_state(root, state)
        log = root / LOG_DIR / "consolidations.md"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a", encoding="utf-8") as handle:
            handle.write(report.summary() + "\n\n")
