"""Shared helpers: repetition statistics, machine info, workload payloads, a no-op tracer."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sqlite3
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

USER_CHARS = 200
TOOL_ARGS_CHARS = 150
TOOL_RESULT_CHARS = 2_000
REPLY_CHARS = 400


_VOCABULARY = tuple(
    hashlib.sha256(f"word{i}".encode())
    .hexdigest()[: 3 + i % 7]
    .translate(str.maketrans("0123456789", "ghijklmnop"))
    for i in range(3_000)
)
"""3,000 made-up words of 3-9 letters: text with a vocabulary, as prose has (a full-text
index over unique random tokens would be unrealistically large)."""


def text(seed: str, chars: int) -> str:
    """Deterministic prose-like text of exactly ``chars`` characters."""
    out: list[str] = []
    size = 0
    counter = 0
    while size < chars:
        digest = hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        for i in range(0, 32, 2):
            word = _VOCABULARY[int.from_bytes(digest[i : i + 2], "big") % len(_VOCABULARY)]
            out.append(word)
            size += len(word) + 1
        counter += 1
    return " ".join(out)[:chars]


@dataclass(frozen=True)
class Turn:
    """One conversational turn of the persistence workload."""

    user: str
    query: str
    """The tool call's single argument (~150 chars of JSON arguments)."""
    result: str
    reply: str


@functools.cache
def turn_payload(index: int) -> Turn:
    return Turn(
        user=text(f"user{index}", USER_CHARS),
        query=text(f"query{index}", TOOL_ARGS_CHARS - len('{"query":""}')),
        result=text(f"result{index}", TOOL_RESULT_CHARS),
        reply=text(f"reply{index}", REPLY_CHARS),
    )


@functools.cache
def tool_result_for(query: str) -> str:
    """The 2,000-char tool result every framework's tool returns for ``query``."""
    return text("result:" + query[:32], TOOL_RESULT_CHARS)


def stats(values: Sequence[float]) -> dict[str, float]:
    """min / median / max (and the count) of repeated measurements."""
    if not values:
        return {"min": float("nan"), "median": float("nan"), "max": float("nan"), "n": 0}
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "n": len(values),
    }


def ratio(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """Ratio of two repeated figures: median/median, and the extreme ratios as a range."""

    def safe(x: float, y: float) -> float:
        return x / y if y else float("nan")

    return {
        "min": safe(a["min"], b["max"]),
        "median": safe(a["median"], b["median"]),
        "max": safe(a["max"], b["min"]),
        "n": min(a.get("n", 0), b.get("n", 0)),
    }


class DropExporter(SpanExporter):
    """An exporter that accepts every span and drops it (tracing on, export free)."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def noop_tracer_provider() -> tuple[TracerProvider, DropExporter]:
    """An SDK tracer provider whose spans are built, ended and handed to a dropping exporter."""
    exporter = DropExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def db_bytes(path: Path) -> int:
    """Bytes a SQLite database occupies on disk: the file plus any WAL left beside it."""
    total = 0
    for suffix in ("", "-wal", "-journal"):
        candidate = Path(str(path) + suffix)
        if candidate.exists():
            total += candidate.stat().st_size
    return total


def fresh_path(folder: Path, name: str) -> Path:
    path = folder / name
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    return path


def cpu_seconds() -> float:
    """Process CPU time (user + system, all threads)."""
    return time.process_time()


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "sqlite": sqlite3.sqlite_version,
    }
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as handle:
            info["memory_kib"] = int(handle.readline().split()[1])
    except OSError:
        pass
    return info


PACKAGES = (
    "anabranch",
    "anyio",
    "pydantic",
    "opentelemetry-sdk",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "aiosqlite",
    "langchain-core",
    "openai-agents",
    "openai",
)


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def fsync_probe(folder: Path, commits: int = 50) -> dict[str, float]:
    """Seconds per single-row commit at synchronous FULL and NORMAL (WAL): the disk's floor."""
    out: dict[str, float] = {}
    for level in ("FULL", "NORMAL"):
        path = fresh_path(folder, f"probe_{level}.db")
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={level}")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)")
        started = time.perf_counter()
        for _ in range(commits):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (body) VALUES (?)", ("x" * 2_750,))
            conn.execute("COMMIT")
        out[level] = (time.perf_counter() - started) / commits
        conn.close()
        fresh_path(folder, f"probe_{level}.db")
    return out
