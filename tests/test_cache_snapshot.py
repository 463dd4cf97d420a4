"""The system-prompt snapshot: built once per run, reused byte-for-byte, rebuilt on compaction."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import anyio
import pytest

from anabranch import Runtime
from anabranch.cli import main
from anabranch.errors import ModelConnectionError
from anabranch.messages import ModelRequest
from anabranch.models._retry import RetryPolicy
from anabranch.runtime._context_view import ContextChange
from anabranch.runtime._loop import AgentRun
from anabranch.runtime._recall import PREVENTIVE_NOTE
from anabranch.testing import FunctionModel

from ._cache_support import ScriptedPipeline, agent, compact, tool_loop
from .helpers import failed_with

pytestmark = pytest.mark.anyio


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    (folder / "AGENTS.md").write_text("Run the tests with make check.\n")
    (folder / "USER.md").write_text("The user prefers short answers.\n")
    return folder  # no MEMORY.md


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[dt.datetime]:
    """The date the prompt sees; replace ``clock[0]`` to move it."""
    moment = [dt.datetime(2026, 11, 30, 9, 0, tzinfo=dt.UTC)]
    monkeypatch.setattr("anabranch.runtime._bootstrap.now", lambda: moment[0])
    return moment


async def cli(*argv: str) -> int:
    """The ``anabranch`` command (it runs its own event loop, so in a worker thread)."""
    return await anyio.to_thread.run_sync(main, list(argv))


def _system_text(request: ModelRequest) -> str:
    return "\n".join(b.text for b in request.system)


async def test_snapshot_holds_bootstrap_files_date_and_cwd(
    tmp_path: Path, workspace: Path, clock: list[dt.datetime]
) -> None:
    worker = agent(
        workspace=workspace,
        include_date=True,
        include_cwd=True,
        bootstrap_missing="mark",
        bootstrap_max_chars=20,
    )
    model = tool_loop(2)
    async with Runtime(db=tmp_path / "a.db", model=model) as rt:
        result = await rt.run(worker, "task")
        runs = await rt.store.list_runs(result.session_id)
        snapshots = await rt.store.list_snapshots(runs[0].id)
    static, dynamic = (b.text for b in model.requests[0].system)
    assert static.startswith("Investigate with probe, then report.\n\n")
    assert static.endswith(PREVENTIVE_NOTE)  # the recall tool's note (on by default)
    assert '<agents path="AGENTS.md">\nRun the tests with m\n[... truncated' in dynamic
    assert "truncated: only the first 20 characters of AGENTS.md" in dynamic
    assert '<memory path="MEMORY.md" missing="true"></memory>' in dynamic
    assert "Current date: 2026-11-30" in dynamic
    assert f"Working directory: {Path.cwd()}" in dynamic
    assert dynamic.index("<agents") < dynamic.index("<user") < dynamic.index("<memory")
    assert len(snapshots) == 1


async def test_snapshot_is_reused_for_every_call(
    tmp_path: Path, workspace: Path, clock: list[dt.datetime]
) -> None:
    worker = agent(workspace=workspace, include_date=True)
    model = tool_loop(3)

    async def change_inputs(run: object) -> None:
        (workspace / "AGENTS.md").write_text("CHANGED instructions\n")
        clock[0] = clock[0] + dt.timedelta(days=3)

    pipeline = ScriptedPipeline({2: change_inputs})
    async with Runtime(db=tmp_path / "a.db", model=model, pipeline=pipeline) as rt:
        result = await rt.run(worker, "task")
        runs = await rt.store.list_runs(result.session_id)
        snapshots = await rt.store.list_snapshots(runs[0].id)
    assert len(model.requests) == 4
    assert len({r.system for r in model.requests}) == 1
    assert all(r.tools == model.requests[0].tools for r in model.requests)
    assert "CHANGED" not in _system_text(model.requests[-1])
    assert "2026-11-30" in _system_text(model.requests[-1])
    assert len(snapshots) == 1
    stored = json.loads(snapshots[0].system)
    assert [b["text"] for b in stored] == [b.text for b in model.requests[0].system]


async def test_snapshot_survives_resume_after_files_and_clock_changed(
    tmp_path: Path, workspace: Path, clock: list[dt.datetime]
) -> None:
    worker = agent(workspace=workspace, include_date=True)
    first = tool_loop(2)

    def fail_third(request: ModelRequest) -> object:
        if len(crashing.requests) == 3:
            raise ModelConnectionError("network down")
        return first.function(request)

    crashing = FunctionModel(fail_third)
    first.requests = crashing.requests  # share the call counter with the scripted loop
    db = tmp_path / "a.db"
    async with Runtime(db=db, model=crashing, retry=RetryPolicy(max_attempts=1)) as rt:
        failure = failed_with(await rt.run(worker, "task"), ModelConnectionError)
    session_id = failure.session_id
    assert session_id

    (workspace / "AGENTS.md").write_text("Brand new instructions after the crash.\n")
    (workspace / "MEMORY.md").write_text("- a new memory\n")
    clock[0] = dt.datetime(2027, 1, 15, tzinfo=dt.UTC)

    resumed = tool_loop(2)
    async with Runtime(db=db, model=resumed, agents=[worker]) as rt:
        result = await rt.resume(session_id)
    assert result.status == "done"
    assert resumed.requests, "the resumed run made calls"
    for request in resumed.requests:
        assert request.system == crashing.requests[0].system
        assert request.tools == crashing.requests[0].tools
    assert "Brand new" not in _system_text(resumed.requests[0])
    assert "2027" not in _system_text(resumed.requests[0])


async def test_snapshot_is_rebuilt_after_compaction_and_kept_on_resume(
    tmp_path: Path, workspace: Path, clock: list[dt.datetime]
) -> None:
    worker = agent(workspace=workspace, include_date=True)
    model = tool_loop(4)

    async def change_then_compact(run: AgentRun) -> ContextChange:
        (workspace / "MEMORY.md").write_text("- learned during the run\n")
        clock[0] = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
        return await compact(run)

    pipeline = ScriptedPipeline({3: change_then_compact})
    db = tmp_path / "a.db"
    async with Runtime(db=db, model=model, pipeline=pipeline) as rt:
        result = await rt.run(worker, "task")
        run_id = (await rt.store.list_runs(result.session_id))[0].id
        snapshots = await rt.store.list_snapshots(run_id)
    before, after = model.requests[1], model.requests[2]
    assert "learned during the run" not in _system_text(before)
    assert "learned during the run" in _system_text(after)
    assert "Current date: 2026-12-01" in _system_text(after)
    assert after.system[0] == before.system[0], "the static block is unchanged"
    assert all(r.system == after.system for r in model.requests[2:])
    assert [(s.version, s.reason) for s in snapshots] == [(1, "start"), (2, "compaction")]
    latest = json.loads(snapshots[-1].system)
    assert [b["text"] for b in latest] == [b.text for b in after.system]


async def test_snapshot_off_rebuilds_every_call(
    tmp_path: Path, workspace: Path, clock: list[dt.datetime]
) -> None:
    from anabranch import ContextPolicy

    worker = agent(
        workspace=workspace,
        include_date=True,
        date_format="%Y-%m-%d %H:%M:%S",
        context=ContextPolicy(system_prompt_snapshot=False),
    )
    model = tool_loop(2)

    async def tick(run: object) -> None:
        clock[0] = clock[0] + dt.timedelta(seconds=1)

    async def edit_file(run: object) -> None:
        (workspace / "AGENTS.md").write_text("edited mid-run\n")

    pipeline = ScriptedPipeline({2: tick, 3: edit_file})
    async with Runtime(db=tmp_path / "a.db", model=model, pipeline=pipeline) as rt:
        result = await rt.run(worker, "task")
        run_id = (await rt.store.list_runs(result.session_id))[0].id
        snapshots = await rt.store.list_snapshots(run_id)
    texts = [_system_text(r) for r in model.requests]
    assert "09:00:00" in texts[0] and "09:00:01" in texts[1]
    assert "edited mid-run" in texts[2] and "edited mid-run" not in texts[1]
    assert [s.reason for s in snapshots] == ["start", "rebuild", "rebuild"]


async def test_show_system_prints_the_snapshot(
    tmp_path: Path, workspace: Path, clock: list[dt.datetime], capsys: pytest.CaptureFixture[str]
) -> None:
    worker = agent(workspace=workspace, include_date=True)
    db = tmp_path / "a.db"
    async with Runtime(db=db, model=tool_loop(1)) as rt:
        result = await rt.run(worker, "task")
    capsys.readouterr()
    assert await cli("show", result.session_id, "--system", "--db", str(db)) == 0
    out = capsys.readouterr().out
    assert "snapshot v1 (start" in out
    assert "--- system block 1 (static) ---\nInvestigate with probe, then report." in out
    assert '<agents path="AGENTS.md">' in out and "Current date: 2026-11-30" in out
    assert "--- tools (2): probe, recall" in out
    assert await cli("show", result.run_id, "--system", "--db", str(db)) == 0
    assert "Investigate with probe" in capsys.readouterr().out
