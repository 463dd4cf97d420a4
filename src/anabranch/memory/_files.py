"""Memory files on disk: one Markdown file per memory with frontmatter, and the index.

A memory file::

    ---
    name: prefers-metric-units
    description: The user wants metric units in every estimate
    type: user
    created: 2026-12-01T08:00:00+00:00
    updated: 2026-12-01T08:00:00+00:00
    source_session: 3f2a...
    source_run: 3f2a...-0
    source_message: 12
    ---
    The user asked twice for kilometres instead of miles.

Writes replace files atomically (a temporary file, then ``os.replace``) under an exclusive
lock on ``.lock`` in the folder, so parallel sub-agents and several processes never leave
a half-written file or an index out of step. A file that is not UTF-8 or has no valid
frontmatter is skipped with a warning.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from anabranch.agents import MEMORY_TYPES, MemoryType

__all__ = [
    "INDEX_FILE",
    "MemoryFile",
    "MemoryFolder",
    "MemoryWriteError",
    "Provenance",
    "append_log",
    "atomic_write",
    "merged_lines",
    "now_iso",
    "sanitize_name",
]

_log = logging.getLogger(__name__)

INDEX_FILE = "MEMORY.md"
_LOCK_FILE = ".lock"
_NAME_CHARS = re.compile(r"[^a-z0-9_-]+")
_MAX_NAME = 64
_MAX_DESCRIPTION = 300
_FIELDS = ("name", "description", "type", "created", "updated")
_SOURCE_FIELDS = ("source_session", "source_run", "source_message", "source_messages")
_RANGE = re.compile(r"(\d+)-(\d+)")


class MemoryWriteError(ValueError):
    """A memory could not be written; the message says why (shown to the model as is)."""


@dataclass(frozen=True)
class Provenance:
    """Where a memory was written from."""

    session_id: str | None = None
    run_id: str | None = None
    message_seq: int | None = None
    message_range: tuple[int, int] | None = None
    """The first and last message seq of a range it was extracted from (before a
    compaction), inclusive."""

    @property
    def range_text(self) -> str | None:
        span = self.message_range
        return None if span is None else f"{span[0]}-{span[1]}"


@dataclass(frozen=True)
class MemoryFile:
    name: str
    description: str
    type: MemoryType
    content: str
    created: str
    updated: str
    source: Provenance = Provenance()

    @property
    def filename(self) -> str:
        return f"{self.name}.md"

    def render(self) -> str:
        lines = ["---"]
        lines += [f"{key}: {_one_line(str(getattr(self, key)))}" for key in _FIELDS]
        source = self.source
        values = (source.session_id, source.run_id, source.message_seq, source.range_text)
        for key, value in zip(_SOURCE_FIELDS, values, strict=True):
            if value is not None:
                lines.append(f"{key}: {_one_line(str(value))}")
        lines.append("---")
        return "\n".join(lines) + "\n" + self.content.strip("\n") + "\n"

    @property
    def index_line(self) -> str:
        return f"- [{self.name}]({self.filename}): {self.description}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def merged_lines(old: str, new: str) -> str:
    """``old``, then the lines of ``new`` it does not hold yet."""
    have = {line.strip() for line in old.splitlines() if line.strip()}
    fresh = [line for line in new.splitlines() if line.strip() and line.strip() not in have]
    return "\n".join([old.strip("\n"), *fresh]) if fresh else old.strip("\n")


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


def sanitize_name(name: str) -> str:
    """A safe file stem: lower-case letters, digits, ``-`` and ``_``; no dots, no slashes.

    Raises ``MemoryWriteError`` when nothing usable is left.
    """
    cleaned = _NAME_CHARS.sub("-", name.strip().lower()).strip("-_")
    cleaned = re.sub(r"-{2,}", "-", cleaned)[:_MAX_NAME].strip("-_")
    if not cleaned:
        raise MemoryWriteError(
            f"memory name {name!r} has no usable characters (use letters, digits, '-' or '_')"
        )
    if cleaned == INDEX_FILE[:-3].lower():
        raise MemoryWriteError("the name 'memory' is reserved for the index")
    return cleaned


def parse(text: str, *, path: Path) -> MemoryFile | None:
    """A memory file's fields, or ``None`` (with a warning) when it is malformed."""
    if not text.startswith("---\n"):
        _log.warning("memory file %s has no frontmatter; skipped", path)
        return None
    end = text.find("\n---\n", 4)
    if end < 0:
        _log.warning("memory file %s has unterminated frontmatter; skipped", path)
        return None
    fields: dict[str, str] = {}
    for line in text[4:end].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    kind = fields.get("type", "")
    if kind not in MEMORY_TYPES or not fields.get("name") or not fields.get("description"):
        _log.warning("memory file %s lacks a valid name, description or type; skipped", path)
        return None
    seq = fields.get("source_message")
    span = _RANGE.fullmatch(fields.get("source_messages", ""))
    return MemoryFile(
        name=fields["name"],
        description=fields["description"],
        type=kind,  # checked against MEMORY_TYPES above
        content=text[end + 5 :].strip("\n"),
        created=fields.get("created", ""),
        updated=fields.get("updated", fields.get("created", "")),
        source=Provenance(
            session_id=fields.get("source_session"),
            run_id=fields.get("source_run"),
            message_seq=int(seq) if seq and seq.isdigit() else None,
            message_range=(int(span.group(1)), int(span.group(2))) if span else None,
        ),
    )


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step (never a half-written file)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class MemoryFolder:
    """The memories of one folder. Blocking file I/O: call from a worker thread."""

    def __init__(self, root: Path, *, max_file_chars: int = 20_000, max_memories: int = 1_000):
        self.root = root
        self.max_file_chars = max_file_chars
        self.max_memories = max_memories

    # ------------------------------------------------------------------ reading
    def _paths(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted(
            p
            for p in self.root.glob("*.md")
            if p.name != INDEX_FILE and not p.name.startswith(".") and p.is_file()
        )

    def read(self, name: str) -> MemoryFile | None:
        path = self.root / f"{sanitize_name(name)}.md"
        return self._read_path(path)

    def _read_path(self, path: Path) -> MemoryFile | None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except UnicodeDecodeError:
            _log.warning("memory file %s is not UTF-8; skipped", path)
            return None
        except OSError as exc:
            _log.warning("memory file %s cannot be read: %s", path, exc)
            return None
        return parse(text.replace("\r\n", "\n"), path=path)

    def all(self) -> list[MemoryFile]:
        """Every valid memory, most recently updated first."""
        memories = [m for m in (self._read_path(p) for p in self._paths()) if m is not None]
        return sorted(memories, key=lambda m: (m.updated, m.name), reverse=True)

    def index_text(self) -> str | None:
        try:
            return (self.root / INDEX_FILE).read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return None
        except OSError as exc:
            _log.warning("memory index %s cannot be read: %s", self.root / INDEX_FILE, exc)
            return None

    # ------------------------------------------------------------------ writing
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """An exclusive lock on the folder (threads and processes alike)."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / _LOCK_FILE, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def write(
        self,
        *,
        name: str,
        description: str,
        type: MemoryType,
        content: str,
        source: Provenance = Provenance(),
        merge: bool = False,
    ) -> tuple[MemoryFile, bool]:
        """Create or update one memory and rewrite the index; ``(memory, created)``.

        With ``merge``, an existing memory of that name keeps its content and gains the
        new lines it lacks (an extraction never overwrites what someone wrote)."""
        stem = sanitize_name(name)
        description = _one_line(description)
        if not description:
            raise MemoryWriteError("a memory needs a one-line description")
        if len(description) > _MAX_DESCRIPTION:
            raise MemoryWriteError(
                f"the description has {len(description)} characters; keep it under "
                f"{_MAX_DESCRIPTION} (it is the memory's line in the index)"
            )
        if type not in MEMORY_TYPES:
            raise MemoryWriteError(f"type must be one of {', '.join(MEMORY_TYPES)}")
        if not content.strip():
            raise MemoryWriteError("a memory needs content")
        if len(content) > self.max_file_chars:
            raise MemoryWriteError(
                f"the content has {len(content):,} characters; the limit is "
                f"{self.max_file_chars:,}: keep only what is durable, or split it"
            )
        with self.locked():
            previous = self._read_path(self.root / f"{stem}.md")
            if previous is None and len(self._paths()) >= self.max_memories:
                raise MemoryWriteError(
                    f"the memory folder holds {self.max_memories} memories, its limit: "
                    "update or forget existing ones first"
                )
            stamp = now_iso()
            text = content.strip("\n")
            if merge and previous is not None:
                text = merged_lines(previous.content, text)
                if len(text) > self.max_file_chars:
                    raise MemoryWriteError(
                        f"memory {stem!r} would grow past {self.max_file_chars:,} characters"
                    )
            memory = MemoryFile(
                name=stem,
                description=description,
                type=type,
                content=text,
                created=previous.created if previous else stamp,
                updated=stamp,
                source=source,
            )
            atomic_write(self.root / memory.filename, memory.render())
            self._write_index()
        return memory, previous is None

    def replace_all(self, memories: list[MemoryFile], removed: list[str]) -> None:
        """Write ``memories`` and delete ``removed`` (names) in one locked step."""
        with self.locked():
            for memory in memories:
                atomic_write(self.root / memory.filename, memory.render())
            for name in removed:
                with contextlib.suppress(FileNotFoundError):
                    (self.root / f"{sanitize_name(name)}.md").unlink()
            self._write_index()

    def forget(self, name: str) -> bool:
        stem = sanitize_name(name)
        with self.locked():
            try:
                (self.root / f"{stem}.md").unlink()
            except FileNotFoundError:
                return False
            self._write_index()
        return True

    def _write_index(self) -> None:
        """Rewrite ``MEMORY.md`` from the files (caller holds the lock)."""
        memories = sorted(self.all(), key=lambda m: m.name)
        lines = ["# Memory index", ""] + [m.index_line for m in memories]
        atomic_write(self.root / INDEX_FILE, "\n".join(lines) + "\n")


def append_log(
    root: Path, text: str, *, when: dt.datetime | None = None, marker: str | None = None
) -> Path:
    """Append one entry to today's log ``logs/YYYY/MM/YYYY-MM-DD.md`` (never rewritten).

    With ``marker`` (a tool call id), an entry already logged under it is not added again,
    so a tool call re-run after a crash logs once.
    """
    moment = (when or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    path = root / "logs" / f"{moment:%Y}" / f"{moment:%m}" / f"{moment:%Y-%m-%d}.md"
    folder = MemoryFolder(root)
    with folder.locked():
        path.parent.mkdir(parents=True, exist_ok=True)
        tag = f" <!-- {marker} -->" if marker else ""
        if marker and path.exists() and tag in path.read_text(encoding="utf-8", errors="replace"):
            return path
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.write(f"- {moment:%H:%M} {_one_line(text)}{tag}\n")
    return path
