"""Compaction ahead: from a soft threshold the oldest range is summarized in the background
while the agent keeps working; the summary is swapped in at a call boundary, only if the
range is still the context's prefix; a ``kill -9`` mid-way leaves nothing half-applied.

Through the real SDK against the local server; the summarizer is held on events, so what
runs while it is pending is ordered by the test, never by sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from anabranch import Agent, AnthropicModel, ContextPolicy, Runtime, tool
from anabranch.context._budget import is_cleared
from anabranch.context._pairing import pairing_violations
from anabranch.messages import ModelRequest, ToolUseBlock
from anabranch.runtime._ahead import Ahead, AheadSummaries
from anabranch.runtime._loop import AgentRun
from anabranch.testing import FunctionModel, MessagesServer
from anabranch.testing._models import is_summary_request

from .compaction_helpers import FAST_RETRY, small_policy
from .helpers import wait_until
from .test_cli import ROOT

pytestmark = pytest.mark.anyio

CALLS = 24
FACT = "F-{n:02d}"


@tool
def survey(n: int) -> str:
    """Survey one host."""
    return f"host {n}: fact {FACT.format(n=n)} noted; " + "steady readings " * 55


def ahead_agent(**policy: Any) -> Agent:
    settings: dict[str, Any] = {
        "window": 7_000,
        "compact_ahead_at": 0.3,
        "tool_result_max_chars": 4_000,
        "keep_recent": 4,
    }
    settings.update(policy)
    return Agent(
        name="prober",
        model="test-model",
        tools=[survey],
        context=small_policy(**settings),
        max_turns=80,
    )


class Summarizer:
    """A policy whose summary requests wait until released; it keeps every fact it is
    shown, and counts the agent's calls made while a summary is pending."""

    def __init__(self, *, hold: int = 1) -> None:
        self.hold = hold
        """How many summary requests are held (later ones answer at once)."""
        self.release = anyio.Event()
        self.pending = 0
        self.during: list[int] = []
        """For each held summary: agent calls served while it was pending."""
        self.summaries = 0
        self.arrived = anyio.Event()

    def model(self) -> FunctionModel:
        return FunctionModel(self.answer)

    async def answer(self, request: ModelRequest) -> Any:
        if is_summary_request(request):
            self.summaries += 1
            number = self.summaries
            if number <= self.hold:
                self.pending += 1
                self.during.append(0)
                self.arrived.set()
                await self.release.wait()
                self.pending -= 1
            text = str([m.content for m in request.messages])
            facts = sorted({FACT.format(n=n) for n in range(CALLS) if FACT.format(n=n) in text})
            return f"<summary>S{number}: surveyed; facts " + " ".join(facts) + "</summary>"
        if self.pending:
            self.during[-1] += 1
        return self.next_call(request)

    def next_call(self, request: ModelRequest) -> Any:
        text = str([m.content for m in request.messages])
        seen = [n for n in range(CALLS) if FACT.format(n=n) in text]
        called = [u.input["n"] for m in request.messages for u in m.tool_uses]
        step = max([*seen, *called], default=-1) + 1
        if step >= CALLS:  # the report names the facts still in view (kept or summarized)
            return "Report: " + " ".join(FACT.format(n=n) for n in seen)
        return [ToolUseBlock(id=f"toolu_p{step}", name="survey", input={"n": step})]


async def _compactions(rt: Runtime, session_id: str) -> list[Any]:
    return [
        b
        for b in await rt.store.list_boundaries(session_id=session_id)
        if b.kind == "compaction" and b.status == "ok"
    ]


async def test_the_agent_works_while_the_summary_is_computed_and_does_not_wait(
    tmp_path: Path,
) -> None:
    policy = Summarizer()
    with anyio.fail_after(90):
        async with MessagesServer(policy.model()) as server:
            model = AnthropicModel(base_url=server.base_url, api_key="test")
            try:
                async with Runtime(db=tmp_path / "a.db", model=model, retry=FAST_RETRY) as rt:
                    async with anyio.create_task_group() as group:
                        results: list[Any] = []

                        async def run() -> None:
                            results.append(await rt.run(ahead_agent(), "Survey every host"))

                        group.start_soon(run)
                        await policy.arrived.wait()
                        # the agent goes on while the summary is pending: two more calls
                        await wait_until(_async(lambda: policy.during[0] >= 2), within=60)
                        policy.release.set()
                    boundaries = await _compactions(rt, results[0].session_id)
            finally:
                await model.aclose()
    result = results[0]
    assert result.status == "done", result.error
    assert all(r.status == 200 for r in server.log)
    assert boundaries and boundaries[0].trigger == "ahead"
    extra = json.loads(boundaries[0].extra)
    assert extra["ahead"]["waited"] is False  # ready before the hard threshold
    assert extra["manifest"]["removed_messages"]  # a manifest like any compaction
    assert (boundaries[0].summary or "").startswith("S1")
    assert boundaries[0].tokens_before < ahead_agent().context.threshold
    # no silent loss: every fact reaches the report (through the summary)
    assert all(FACT.format(n=n) in result.output for n in range(CALLS))


async def test_a_summary_of_a_range_that_changed_is_discarded(tmp_path: Path) -> None:
    """Clearing (at 0.45 of the window) replaces messages of the range being summarized
    ahead (from 0.3): that summary is dropped, never swapped in."""
    policy = Summarizer()
    agent = ahead_agent(clear_tool_results_after=1, clear_at=0.45)
    original = policy.next_call

    def release_after_clearing(request: ModelRequest) -> Any:
        if any(is_cleared(b) for m in request.messages for b in m.tool_results):
            policy.release.set()
        return original(request)

    policy.next_call = release_after_clearing  # type: ignore[method-assign]
    with anyio.fail_after(90):
        async with MessagesServer(policy.model()) as server:
            model = AnthropicModel(base_url=server.base_url, api_key="test")
            try:
                async with Runtime(db=tmp_path / "d.db", model=model, retry=FAST_RETRY) as rt:
                    result = await rt.run(agent, "Survey every host")
                    boundaries = await rt.store.list_boundaries(session_id=result.session_id)
            finally:
                await model.aclose()
    assert result.status == "done", result.error
    assert all(r.status == 200 for r in server.log)
    assert any(b.kind == "clear" for b in boundaries)
    assert policy.release.is_set() and policy.summaries >= 1  # S1 was made, after the clear
    summaries = [b.summary or "" for b in boundaries if b.kind == "compaction"]
    assert not any(s.startswith("S1") for s in summaries)  # and never swapped in


async def test_a_call_at_the_hard_threshold_waits_for_the_summary_in_flight() -> None:
    summaries = AheadSummaries()

    class Step:  # what ``take`` reads of a pipeline step
        def __init__(self) -> None:
            self.view = self  # the run's view (a run here)
            self.context: tuple[Any, ...] = ()
            self.agent = ahead_agent()

    step: Any = Step()
    ahead = Ahead(index=1, head=(), seqs=[], boundary_id=None, tokens=0)
    summaries._runs[step.view] = ahead
    assert await summaries.take(step, wait=False) is None  # not ready: the call goes on
    taken: list[Any] = []

    async def take() -> None:
        taken.append(await summaries.take(step, wait=True))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(take)
            await anyio.wait_all_tasks_blocked()
            assert taken == []  # waiting for it
            ahead.failure = "the summarizer failed"
            ahead.ready.set()
    assert taken == [None]  # a failed one is dropped; the threshold compacts inline
    assert summaries.pending(step.view) is None


def test_the_soft_threshold_must_be_below_the_hard_one() -> None:
    with pytest.raises(ValueError, match="compact_ahead_at"):
        ContextPolicy(window=10_000, compact_at=0.6, compact_ahead_at=0.7)


CHILD = """
import sys
import anyio
from anabranch import AnthropicModel, Runtime
from tests.compaction_helpers import FAST_RETRY
from tests.test_compaction_ahead import ahead_agent

async def main(base_url, db, marker):
    model = AnthropicModel(base_url=base_url, api_key="test")
    async with Runtime(db=db, model=model, retry=FAST_RETRY) as rt:
        def started(session_id):
            with open(marker, "w") as out:
                out.write(session_id)
        await rt.run(ahead_agent(), "Survey every host", on_session=started)

anyio.run(main, *sys.argv[1:])
"""


async def test_kill_9_while_a_summary_is_ahead_leaves_a_consistent_context(
    tmp_path: Path,
) -> None:
    policy = Summarizer(hold=1)
    db, marker = tmp_path / "k.db", tmp_path / "session"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{ROOT / 'src'}"
    with anyio.fail_after(120):
        async with MessagesServer(policy.model()) as server:
            with (tmp_path / "child.err").open("w") as errors:
                child = await anyio.open_process(
                    [sys.executable, "-c", CHILD, server.base_url, str(db), str(marker)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=errors,
                )
            try:
                await policy.arrived.wait()
                await wait_until(_async(lambda: policy.during[0] >= 2), within=60)
                child.send_signal(signal.SIGKILL)  # the summary is still pending
                await child.wait()
            finally:
                if child.returncode is None:
                    child.kill()
                    with anyio.CancelScope(shield=True):
                        await child.wait()
            assert child.returncode == -signal.SIGKILL, (tmp_path / "child.err").read_text()
            session_id = marker.read_text()
            policy.release.set()
            model = AnthropicModel(base_url=server.base_url, api_key="test")
            try:
                async with Runtime(db=db, model=model, retry=FAST_RETRY) as rt:
                    before = await _compactions(rt, session_id)
                    served = len(server.log)
                    result = await rt.resume(session_id, agent=ahead_agent())
                    root = (await rt.store.list_runs(session_id))[0]
                    records = await rt.store.load_messages(root.id)
                    run = await AgentRun.load(rt.environment(session_id), ahead_agent(), root)
            finally:
                await model.aclose()
    assert before == []  # nothing of the pending summary was committed
    assert result.status == "done", result.error
    assert all(r.status == 200 for r in server.log[served:])
    assert [r.seq for r in records] == list(range(len(records)))
    assert pairing_violations(run.context) == []
    assert all(FACT.format(n=n) in result.output for n in range(CALLS))


def _async(check: Any) -> Any:
    async def wrapped() -> bool:
        return bool(check())

    return wrapped
