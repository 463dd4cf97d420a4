"""Model-written consolidation through the real SDK against the local server: a model
merges overlapping memories and distills the logs; a failed call or a bad plan falls back
to the deterministic merge, and the change summary says which path ran."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from anabranch import Agent, AnthropicModel, Memory, Runtime
from anabranch.memory import MemoryFolder, consolidate_with_model
from anabranch.memory._consolidate import STATE_FILE
from anabranch.memory._consolidate_model import CONSOLIDATE_TOOL
from anabranch.memory._files import append_log
from anabranch.messages import Block, ModelRequest, TextBlock, ToolUseBlock
from anabranch.testing import FunctionModel, MessagesServer, TestModel

from .test_memory_consolidate import _folder_with_overlap

pytestmark = pytest.mark.anyio


def _folder(root: Path) -> MemoryFolder:
    folder = _folder_with_overlap(root)
    yesterday = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    append_log(root, "Moved the staging soak to two days.", when=yesterday)
    return folder


async def test_a_model_merges_overlapping_memories_and_distills_the_logs(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    with anyio.fail_after(30):
        async with MessagesServer(TestModel()) as srv:
            model = AnthropicModel(base_url=srv.base_url, api_key="test")
            try:
                report = await consolidate_with_model(
                    tmp_path, model=model, model_name="cheap-model"
                )
            finally:
                await model.aclose()
    request = next(r.request for r in srv.log if r.request is not None)
    assert request.settings.tool_choice == CONSOLIDATE_TOOL
    assert report.method == "model cheap-model"
    assert report.merged == [("release-days", ["release-schedule"])]
    names = sorted(m.name for m in folder.all())
    assert names == sorted(["release-days", "tea", *report.distilled])
    merged = folder.read("release-days")
    assert merged is not None and "Releases happen on Wednesdays." in merged.content
    distilled = folder.read(report.distilled[0])
    assert distilled is not None and "two days" in distilled.content
    # the originals the model rewrote are archived, and the summary names the path
    archived = sorted(p.name for p in (tmp_path / "logs" / "archive").glob("*/*.md"))
    assert archived == ["release-days.md", "release-schedule.md"]
    summary = (tmp_path / "logs" / "consolidations.md").read_text()
    assert (
        "(model cheap-model)" in summary and "merged release-schedule into release-days" in summary
    )


def _bad_plan(request: ModelRequest) -> list[Block]:
    plan = {"merges": [{"names": ["release-days", "nope"], "name": "x", "description": "d",
                        "type": "project", "content": "c"}]}  # fmt: skip
    return [ToolUseBlock(id="toolu_bad0001", name=CONSOLIDATE_TOOL, input=plan)]


def _no_tool_call(request: ModelRequest) -> list[Block]:
    return [TextBlock(text="I would merge the release memories.")]


@pytest.mark.parametrize(
    ("policy", "why"),
    [(_bad_plan, "a merge must name two or more memories"), (_no_tool_call, "Error")],
)
async def test_a_failed_call_or_a_bad_plan_falls_back_to_the_deterministic_merge(
    tmp_path: Path, policy: object, why: str
) -> None:
    folder = _folder(tmp_path)
    before = {m.name: m.content for m in folder.all()}
    with anyio.fail_after(30):
        # a policy that does not call the forced tool gets the API's 500 from the server
        async with MessagesServer(FunctionModel(policy)) as srv:  # type: ignore[arg-type]
            model = AnthropicModel(base_url=srv.base_url, api_key="test")
            try:
                report = await consolidate_with_model(tmp_path, model=model, model_name="m")
            finally:
                await model.aclose()
    assert report.method.startswith("deterministic (model m failed:")
    assert why in report.method
    assert report.merged == [("release-days", ["release-schedule"])]  # the deterministic one
    merged = folder.read("release-days")
    assert merged is not None and before["release-schedule"].splitlines()[1] in merged.content
    summary = (tmp_path / "logs" / "consolidations.md").read_text()
    assert "(deterministic (model m failed:" in summary


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # a subprocess: one backend is enough
async def test_the_consolidate_command_uses_a_model_against_the_local_server(
    tmp_path: Path,
) -> None:
    _folder(tmp_path / "memory")
    with anyio.fail_after(60):
        async with MessagesServer(TestModel()) as srv:
            env = {**os.environ, "ANTHROPIC_BASE_URL": srv.base_url, "ANTHROPIC_API_KEY": "t"}
            done = await anyio.run_process(
                [sys.executable, "-m", "anabranch", "memory", "consolidate",
                 str(tmp_path / "memory"), "--model", "cheap-model"],
                env=env,
                check=False,
            )  # fmt: skip
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "(model cheap-model)" in out
    assert "merged release-schedule into release-days" in out
    assert any(r.request is not None for r in srv.log)


async def test_automatic_consolidation_uses_the_configured_model(tmp_path: Path) -> None:
    _folder(tmp_path / "memory")
    (tmp_path / "memory" / STATE_FILE).write_text(json.dumps({"sessions_since": 4}))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    memory = Memory(dir=tmp_path / "memory", auto_consolidate=True, consolidate_model="cheap")
    model = TestModel(rounds=0)
    with anyio.fail_after(30):
        async with Runtime(db=tmp_path / "x.db", model=model, tracer_provider=provider) as rt:
            await rt.run(Agent(name="a", memory=memory), "first")
    assert [r.model for r in model.requests][0] == "cheap"
    spans = [s for s in exporter.get_finished_spans() if s.name == "memory consolidate a"]
    assert [dict(s.attributes or {})["anabranch.memory.method"] for s in spans] == ["model cheap"]
    assert MemoryFolder(tmp_path / "memory").read("release-schedule") is None  # merged away
