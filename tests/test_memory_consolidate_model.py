"""Model-written consolidation through the real SDK against the local server: a model
merges overlapping memories and distills the logs; a failed call or a bad plan falls back
to the deterministic merge, and the change summary says which path ran."""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path

import anyio
import pytest

from anabranch import AnthropicModel
from anabranch.memory import MemoryFolder, consolidate_with_model
from anabranch.memory._consolidate_model import CONSOLIDATE_TOOL
from anabranch.memory._files import append_log
from anabranch.messages import Block, ModelRequest, TextBlock, ToolUseBlock
from anabranch.testing import FunctionModel, MessagesServer, TestModel

pytestmark = pytest.mark.anyio


def _folder(root: Path) -> MemoryFolder:
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
