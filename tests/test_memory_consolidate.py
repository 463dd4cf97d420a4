"""Consolidation: overlapping memories merge (newest wins, nothing silently lost), the
daily logs are distilled, old memories pruned; the CLI; automatic consolidation."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from anabranch import Agent, Memory, Runtime
from anabranch.memory import MemoryFolder, consolidate, consolidation_due
from anabranch.memory._consolidate import STATE_FILE
from anabranch.memory._files import append_log
from anabranch.testing import TestModel


def _folder_with_overlap(root: Path) -> MemoryFolder:
    folder = MemoryFolder(root)
    folder.write(
        name="release-schedule",
        description="Releases happen on Tuesdays after the staging soak",
        type="project",
        content="Releases happen on Tuesdays.\nStaging soak lasts one day.",
    )
    folder.write(
        name="release-days",
        description="Releases happen on Wednesdays after the staging soak",
        type="project",
        content="Releases happen on Wednesdays.\nStaging soak lasts one day.",
    )
    folder.write(
        name="tea", description="The user likes green tea", type="user", content="Green tea."
    )
    return folder


def test_overlapping_memories_merge_and_the_newest_wins(tmp_path: Path) -> None:
    folder = _folder_with_overlap(tmp_path)
    report = consolidate(tmp_path)
    assert report.merged == [("release-days", ["release-schedule"])]
    names = sorted(m.name for m in folder.all())
    assert names == ["release-days", "tea"]
    merged = folder.read("release-days")
    assert merged is not None
    head, _, earlier = merged.content.partition("## Earlier notes")
    assert "Wednesdays" in head and "Tuesdays" not in head
    assert "Releases happen on Tuesdays." in earlier  # kept, marked as older
    assert earlier.count("Staging soak lasts one day.") == 0  # not duplicated
    index = (tmp_path / "MEMORY.md").read_text()
    assert "release-schedule" not in index and "release-days" in index
    changes = (tmp_path / "logs" / "consolidations.md").read_text()
    assert "merged release-schedule into release-days" in changes
    again = consolidate(tmp_path)
    assert not again.changed


def test_daily_logs_are_distilled_once_and_never_edited(tmp_path: Path) -> None:
    yesterday = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    path = append_log(tmp_path, "Chose PostgreSQL for the event store", when=yesterday)
    append_log(tmp_path, "Chose PostgreSQL for the event store", when=yesterday, marker="t1")
    append_log(tmp_path, "Chose PostgreSQL for the event store", when=yesterday, marker="t1")
    today = append_log(tmp_path, "still being written")
    before = path.read_bytes()
    report = consolidate(tmp_path)
    month = f"log-{yesterday:%Y-%m}"
    assert report.distilled == [month]
    memory = MemoryFolder(tmp_path).read(month)
    assert memory is not None and "Chose PostgreSQL" in memory.content
    assert "<!--" not in memory.content and "still being written" not in memory.content
    assert path.read_bytes() == before and before.count(b"t1") == 1
    assert not consolidate(tmp_path).distilled
    assert today.exists()


def test_memories_past_the_retention_age_are_pruned(tmp_path: Path) -> None:
    folder = _folder_with_overlap(tmp_path)
    tea = tmp_path / "tea.md"
    tea_text = tea.read_text()
    stale = (dt.datetime.now(dt.UTC) - dt.timedelta(days=40)).isoformat()
    updated_line = next(line for line in tea_text.splitlines() if line.startswith("updated: "))
    tea.write_text(tea_text.replace(updated_line, f"updated: {stale}"))
    report = consolidate(tmp_path, retention_days=30)
    assert report.pruned == ["tea"]
    assert folder.read("tea") is None and folder.read("release-days") is not None


def test_consolidation_is_due_after_a_day_and_five_sessions(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_text(json.dumps({"sessions_since": 4}))
    assert not consolidation_due(tmp_path)
    (tmp_path / STATE_FILE).write_text(json.dumps({"sessions_since": 5}))
    assert consolidation_due(tmp_path)
    recent = dt.datetime.now(dt.UTC).isoformat()
    (tmp_path / STATE_FILE).write_text(json.dumps({"sessions_since": 9, "last_run": recent}))
    assert not consolidation_due(tmp_path)
    (tmp_path / STATE_FILE).write_text("not json")
    assert not consolidation_due(tmp_path)


@pytest.mark.anyio
async def test_sessions_consolidate_automatically_when_due(tmp_path: Path) -> None:
    _folder_with_overlap(tmp_path / "memory")
    old = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=30)).isoformat()
    (tmp_path / "memory" / STATE_FILE).write_text(
        json.dumps({"sessions_since": 4, "last_run": old})
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent = Agent(name="a", memory=Memory(dir=tmp_path / "memory", auto_consolidate=True))
    async with Runtime(
        db=tmp_path / "x.db", model=TestModel(rounds=0), tracer_provider=provider
    ) as rt:
        await rt.run(agent, "first")
    spans = [s for s in exporter.get_finished_spans() if s.name == "memory consolidate a"]
    assert len(spans) == 1
    assert list((spans[0].attributes or {})["anabranch.memory.merged"]) == ["release-days"]  # type: ignore[arg-type]
    state = json.loads((tmp_path / "memory" / STATE_FILE).read_text())
    assert state["sessions_since"] == 0


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "anabranch", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "error::ResourceWarning"},
    )


def test_the_memory_commands(tmp_path: Path) -> None:
    _folder_with_overlap(tmp_path / "memory")
    listed = _cli("memory", "list", cwd=tmp_path)
    assert listed.returncode == 0 and "release-schedule" in listed.stdout and "tea" in listed.stdout
    shown = _cli("memory", "show", "tea", cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout.startswith("---\nname: tea\n")
    found = _cli("memory", "search", "green tea", cwd=tmp_path)
    assert found.stdout.splitlines()[0].startswith("tea (user)")
    missing = _cli("memory", "show", "nothing", cwd=tmp_path)
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1
    merged = _cli("memory", "consolidate", "memory", cwd=tmp_path)
    assert merged.returncode == 0 and "merged release-schedule into release-days" in merged.stdout
    nowhere = _cli("memory", "list", "--dir", "nope", cwd=tmp_path)
    assert nowhere.returncode == 1 and "not a memory folder" in nowhere.stderr
