"""The issue's end-to-end scenario: a supervisor and two sub-agents, all thinking, one
using a tool that returns images, the smallest compacting several times, ``kill -9`` of
``anabranch run`` mid-session, then resume: the real SDK against the local server, which
refuses (400) any thinking block that is missing, altered or out of place."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import anyio.abc
import pytest

from anabranch import AnthropicModel, Image, Runtime
from anabranch.messages import ModelRequest, ModelResponse, ToolResultBlock
from anabranch.testing import MessagesServer, TestModel
from anabranch.testing._models import is_summary_request
from tests.kill_helpers import cli_env, run_and_kill

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4

AGENTS = '''
import time
from pathlib import Path
from anabranch import Agent, ContextPolicy, Image, ModelSettings, tool

HERE = Path(__file__).parent
PNG = b"\\x89PNG\\r\\n\\x1a\\n" + bytes(range(256)) * 4
THINK = ModelSettings(thinking_budget=1024)

@tool
def screenshot(page: int) -> list:
    """Render a page of the chart book."""
    calls = HERE / "screenshots"
    count = int(calls.read_text()) + 1 if calls.exists() else 1
    calls.write_text(str(count))
    if count == 2:
        (HERE / "reached").touch()
        while (HERE / "hold").exists():   # the first process is killed in here
            time.sleep(0.02)
    return [f"page {page} as rendered:", Image(data=PNG, media_type="image/png")]

@tool
def read_notes(part: int) -> str:
    """Read a long part of the field notes."""
    return f"notes part {part}: " + "the tide turns with the moon and the wind. " * 90

viewer = Agent(
    name="viewer", description="looks at charts", instructions="You look at charts.",
    tools=[screenshot], max_tokens=2048, model_settings=THINK,
)
notes = Agent(
    name="notes", description="reads field notes", instructions="You read field notes.",
    tools=[read_notes], max_tokens=2048, model_settings=THINK,
    context=ContextPolicy(window=9000, compact_at=0.5, output_reserve=2048, keep_recent=2),
)
supervisor = Agent(
    name="supervisor", instructions="You split the question and delegate.",
    subagents=[viewer, notes], max_tokens=4096, model_settings=THINK,
)
'''


class PerAgent:
    """The test model with a different number of tool rounds for each agent."""

    def __init__(self) -> None:
        self.models = {
            "You split the question": TestModel(rounds=1),
            "You look at charts": TestModel(rounds=3),
            "You read field notes": TestModel(rounds=8),
        }

    async def request(self, request: ModelRequest) -> ModelResponse:
        system = "\n".join(b.text for b in request.system)
        model = next(m for key, m in self.models.items() if key in system)
        return await model.request(request)


async def test_supervisor_and_thinking_sub_agents_survive_kill_9(tmp_path: Path) -> None:
    (tmp_path / "team.py").write_text(AGENTS)
    (tmp_path / "hold").touch()
    db = tmp_path / "runs.db"
    async with MessagesServer(PerAgent()) as srv:
        session_id = await run_and_kill(
            srv, tmp_path, f"{tmp_path}/team.py:supervisor", "How do tides work?", db,
            what="the second screenshot",
        )  # fmt: skip
        before_kill = len(srv.log)

        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        try:
            async with Runtime(db=db, model=model) as rt:
                with anyio.fail_after(120):
                    result = await rt.resume(session_id)
                runs = {r.agent_name: r for r in await rt.store.list_runs(session_id)}
                compactions = await rt.store.count_boundaries(runs["notes"].id, "ok")
        finally:
            await model.aclose()
        with anyio.fail_after(60):
            show = await anyio.run_process(
                [sys.executable, "-m", "anabranch", "show", session_id, "--calls", "--db", str(db)],
                env=cli_env(srv),
            )

    assert result.status == "done", result.error
    assert result.output.startswith("Report on: How do tides work?")
    log = [r for r in srv.log if r.endpoint == "messages"]
    assert before_kill < len(log)  # the resumed process called the model too
    assert [r.error_message for r in log if r.status != 200] == []  # no 400, ever
    requests = [r.request for r in log if r.request is not None]
    turns = [q for q in requests if not is_summary_request(q)]
    # settings in every request: thinking on for agent turns, off for the summarizer
    assert {q.settings.thinking_budget for q in turns} == {1024}
    summaries = [q for q in requests if is_summary_request(q)]
    assert all(q.settings.thinking_budget is None for q in summaries)
    assert all(not m.thinking_blocks for q in summaries for m in q.messages)
    # thinking sent back on every tool turn: the turn before the tool results leads with it
    tool_turns = [q for q in turns if q.messages[-1].tool_results]
    assert len(tool_turns) >= 10
    for q in tool_turns:
        assert q.messages[-2].content[0].type == "thinking"
    # the images reached the model, before and after the kill
    shots = [
        b
        for q in requests
        for m in q.messages
        for b in m.content
        if isinstance(b, ToolResultBlock) and b.attachments
    ]
    assert {b.attachments for b in shots} == {(Image(data=PNG, media_type="image/png"),)}
    assert compactions >= 2  # the smallest agent compacted several times
    assert "thinking" in show.stdout.decode()
