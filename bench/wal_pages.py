"""Which b-trees the SQLite writer's commits write, in pages, in ``bench/concurrency.py``.

A commit in WAL mode appends every page its transaction changed to the WAL, whole (8 kB
each here), so the pages a commit dirties are most of what COMMIT costs (and what a
checkpoint copies later). This bench counts them, deterministically:

1. ``record``: one ``concurrency.trial(folder, runs, latency)`` in which the store's
   connection reports every statement of every write transaction (SQLite's trace
   callback gives each one with its values inlined).
2. ``pages``: the recorded transactions run again, one by one, on a fresh database with
   automatic checkpoints off, so the WAL keeps every frame; each frame's page number is
   then looked up in ``dbstat`` (which table or index owns that page).

Prints one JSON line: commits, pages per commit and per model call, and pages per commit
by table or index (largest first). The ids in the recording are the ones the trial made,
so a change to how ids are made shows here.

Run: ``PYTHONPATH=src:. python -m bench.wal_pages [runs] [latency]`` (default 1000 0.2).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import struct
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

from anabranch.store.sqlite import _group_commit
from anabranch.store.sqlite._open import open_connection
from bench import concurrency

_FRAME_HEADER = 24
_WAL_HEADER = 32


async def record(folder: Path, runs: int, latency: float) -> tuple[list[list[str]], int]:
    """The statements of each write transaction of one trial, and its model calls."""
    batches: list[list[str]] = []
    current: list[list[str]] = []
    traced: set[int] = set()
    commit_batch = _group_commit._commit_batch

    def statement(sql: str) -> None:
        if current and not sql.startswith("--"):  # "--": a statement inside a trigger
            current[0].append(sql)

    def recorded(conn: sqlite3.Connection, batch: Any, lock_timeout: float) -> None:
        if id(conn) not in traced:
            conn.set_trace_callback(statement)
            traced.add(id(conn))
        current.append([])
        try:
            commit_batch(conn, batch, lock_timeout)
        finally:
            batches.append(current.pop())

    _group_commit._commit_batch = recorded  # type: ignore[assignment]
    try:
        result = await concurrency.trial(folder, runs, latency)
    finally:
        _group_commit._commit_batch = commit_batch
    return batches, int(result["model_calls"])


def pages(folder: Path, batches: list[list[str]]) -> tuple[int, Counter[str]]:
    """Run ``batches`` again on a fresh database; the WAL frames they wrote, by owner."""
    path = folder / "replay.db"
    conn = open_connection(path, True, "OFF")
    try:
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the schema out of the WAL
        for batch in batches:
            for sql in batch:
                conn.execute(sql).fetchall()
        owners = dict(conn.execute("SELECT pageno, name FROM dbstat").fetchall())
        wal = Path(f"{path}-wal").read_bytes()
    finally:
        conn.close()
    page_size = struct.unpack(">I", wal[8:12])[0]
    frames: Counter[str] = Counter()
    commits = 0
    for offset in range(_WAL_HEADER, len(wal) - _FRAME_HEADER - page_size + 1,
                        _FRAME_HEADER + page_size):
        page, size_after_commit = struct.unpack(">II", wal[offset : offset + 8])
        frames[str(owners.get(page, "(free or new)"))] += 1
        commits += size_after_commit != 0  # a commit's last frame records the file's size
    return commits, frames


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    latency = float(sys.argv[2]) if len(sys.argv) > 2 else 0.2
    folder = Path(tempfile.mkdtemp(prefix="anabranch-wal-pages-"))
    try:
        batches, calls = anyio.run(record, folder, runs, latency)
        commits, frames = pages(folder, batches)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    total = sum(frames.values())
    print(
        json.dumps(
            {
                "model_calls": calls,
                "commits": commits,
                "pages_per_commit": round(total / max(commits, 1), 1),
                "pages_per_model_call": round(total / max(calls, 1), 2),
                "pages_per_commit_by_btree": {
                    name: round(count / max(commits, 1), 2)
                    for name, count in frames.most_common()
                },
            }
        )
    )


if __name__ == "__main__":
    main()
