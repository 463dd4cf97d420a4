"""A compaction interrupted by a stop is never half-applied: nothing of it is committed, and
the resumed run redoes it, ending exactly where an uninterrupted run ends."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest

from anabranch import Agent, ContextPolicy, Runtime, ToolContext, tool
from anabranch.messages import ModelRequest, ModelResponse
from anabranch.models._retry import RetryPolicy
from anabranch.testing import TestModel
from anabranch.testing._models import is_summary_request

pytest.importorskip("anabranch.runtime._compactor", reason="compaction has not landed yet")

pytestmark = pytest.mark.anyio

FAST = RetryPolicy(base_delay=0.0, max_delay=0.0)


@tool
async def read(part: int, ctx: ToolContext) -> str:
    """Read one part of the document."""
    return f"part {part}: " + "lorem ipsum dolor " * 30


AGENT = Agent(
    name="reader",
    model="reader-model",
    instructions="Read the parts, then summarize.",
    tools=[read],
    context=ContextPolicy(window=1_600, compact_at=0.6, output_reserve=300, keep_recent=2),
    max_tokens=300,
)


class StopAtSummary:
    """``TestModel``, except that the first summary request stops the process there."""

    def __init__(self, stop: bool) -> None:
        self.inner = TestModel(rounds=4)
        self.stop = stop
        self.reached = anyio.Event()

    async def request(self, request: ModelRequest) -> ModelResponse:
        if self.stop and is_summary_request(request):
            self.reached.set()
            await anyio.sleep_forever()
        return await self.inner.request(request)


def committed(db: Path) -> tuple[list[Any], list[Any]]:
    with closing(sqlite3.connect(db)) as conn:
        messages = conn.execute("SELECT seq, role, kind, content FROM messages ORDER BY seq")
        boundaries = conn.execute(
            "SELECT kind, strategy, status, prefix, ranges, summary FROM boundaries ORDER BY id"
        )
        return messages.fetchall(), boundaries.fetchall()


async def test_interrupted_compaction_is_redone_not_half_applied(tmp_path: Path) -> None:
    uninterrupted = tmp_path / "reference.db"
    async with Runtime(db=uninterrupted, model=StopAtSummary(False), retry=FAST) as rt:
        expected = await rt.run(AGENT, "Read parts 1 to 4.")
    want_messages, want_boundaries = committed(uninterrupted)
    assert want_boundaries, "the scenario must compact"

    db = tmp_path / "s.db"
    model = StopAtSummary(True)
    ids: list[str] = []
    async with Runtime(db=db, model=model, retry=FAST) as rt:
        async with anyio.create_task_group() as group:

            async def run() -> None:
                await rt.run(AGENT, "Read parts 1 to 4.", on_session=ids.append)

            group.start_soon(run)
            await model.reached.wait()
            group.cancel_scope.cancel()

    messages, boundaries = committed(db)
    assert boundaries == []  # nothing of the compaction in progress was committed
    assert messages == [m for m in want_messages[: len(messages)]]

    async with Runtime(db=db, model=StopAtSummary(False), retry=FAST, agents=[AGENT]) as rt:
        result = await rt.resume(ids[0])
    assert result.output == expected.output
    assert committed(db) == (want_messages, want_boundaries)


class Recorder:
    """``TestModel`` that keeps every request."""

    def __init__(self) -> None:
        self.inner = TestModel(rounds=4)
        self.requests: list[ModelRequest] = []

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        return await self.inner.request(request)


def _memory_agent(workspace: Path) -> Agent:
    @tool
    async def remember(fact: str, ctx: ToolContext) -> str:
        """Write a fact to memory (the next prompt rebuild shows it)."""
        (workspace / "MEMORY.md").write_text(f"Remembered: {fact}")
        return "remembered " + "and noted " * 40

    update = {"tools": (read, remember), "workspace": workspace, "bootstrap_files": ("MEMORY.md",)}
    return AGENT.model_copy(update=update)


def snapshots(db: Path) -> list[Any]:
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute("SELECT version, reason, system, tools FROM snapshots").fetchall()


async def test_stop_between_boundary_and_prompt_rebuild(tmp_path: Path) -> None:
    """The boundary and the rebuilt prompt snapshot are two commits; a stop between them
    must not leave the run on the old prompt."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "MEMORY.md").write_text("Remembered: nothing yet")
    agent = _memory_agent(workspace)

    reference = Recorder()
    async with Runtime(db=tmp_path / "reference.db", model=reference, retry=FAST) as rt:
        expected = await rt.run(agent, "Read and remember.")
    summary_at = next(i for i, r in enumerate(reference.requests) if is_summary_request(r))
    after_compaction = reference.requests[summary_at + 1]
    assert "Remembered: Read and remember." in after_compaction.system[-1].text  # rebuilt

    (workspace / "MEMORY.md").write_text("Remembered: nothing yet")
    db = tmp_path / "s.db"
    ids: list[str] = []
    reached = anyio.Event()
    async with Runtime(db=db, model=Recorder(), retry=FAST) as rt:
        save = rt.store.save_snapshot

        async def hold_rebuild(snapshot: Any) -> None:
            if snapshot.reason == "compaction":
                reached.set()
                await anyio.sleep_forever()
            await save(snapshot)

        rt.store.save_snapshot = hold_rebuild  # type: ignore[method-assign]
        async with anyio.create_task_group() as group:

            async def run() -> None:
                await rt.run(agent, "Read and remember.", on_session=ids.append)

            group.start_soon(run)
            await reached.wait()
            group.cancel_scope.cancel()
    assert [b[2] for b in committed(db)[1]] == ["ok"]  # the boundary is committed...
    assert [s[1] for s in snapshots(db)] == ["start"]  # ...the rebuilt prompt is not

    resumed = Recorder()
    async with Runtime(db=db, model=resumed, retry=FAST, agents=[agent]) as rt:
        result = await rt.resume(ids[0])
    assert resumed.requests[0] == after_compaction
    assert result.output == expected.output
    assert snapshots(db) == snapshots(tmp_path / "reference.db")
