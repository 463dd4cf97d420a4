"""``quiet_before_call`` says "nothing to do" only when ``before_call`` would do nothing.

The loop skips the compacting pipeline's ``before_call`` for a call whose row it commits
with the tool turn's last result, on ``quiet_before_call``'s word (``runtime/_quiet_call.py``
mirrors ``before_call``'s branches). Differential check under pressure: the same
compacting runs (small windows, cleared tool results, many turns) with the shortcut and
with it turned off must send the model exactly the same requests, and the shortcut must
have been taken (or the check proves nothing).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from anabranch import Agent, ContextPolicy, Runtime, tool
from anabranch.runtime._compactor import CompactingPipeline
from anabranch.testing import TestModel

pytestmark = pytest.mark.anyio


@tool
async def note(text: str) -> str:
    """Record a note."""
    return "noted " + text + " " + "detail " * 40


_RANDOM_IDS = re.compile(r"\b(out|run|ses)_[0-9a-f]{16}\b")
"""Ids drawn at random per run (recall handles of cleared results, runs, sessions)."""

POLICIES = {
    "small window": ContextPolicy(window=2_000),
    "cleared results": ContextPolicy(window=3_000, clear_tool_results_after=2),
    "compaction ahead": ContextPolicy(window=3_000, compact_ahead_at=0.5),
}


async def _requests(path: Path, policy: ContextPolicy) -> tuple[list[str], int]:
    agent = Agent(
        name="a", model="claude-sonnet-4-5", instructions="Work.", tools=[note], context=policy
    )
    model = TestModel(rounds=14)
    with anyio.fail_after(60):
        async with Runtime(path, model=model) as rt:
            result = await rt.run(agent, "take notes")
            boundaries = await rt.store.list_boundaries(session_id=result.session_id)
    assert result.status == "done", result.status
    sent = [
        _RANDOM_IDS.sub(
            r"\1_<id>", request.model_dump_json(include={"model", "system", "messages", "tools"})
        )
        for request in model.requests
    ]
    return sent, len(boundaries)


@pytest.mark.parametrize("policy", POLICIES, ids=list(POLICIES))
async def test_the_shortcut_sends_what_before_call_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    quiet = CompactingPipeline.quiet_before_call
    taken: list[bool] = []

    def spy(self: CompactingPipeline, run: Any) -> bool:
        answer = quiet(self, run)
        taken.append(answer)
        return answer

    monkeypatch.setattr(CompactingPipeline, "quiet_before_call", spy)
    with_shortcut, compactions = await _requests(tmp_path / "quiet.db", POLICIES[policy])
    assert True in taken, "the shortcut was never taken: the comparison proves nothing"
    assert compactions > 0, "the run never compacted: the comparison proves nothing"

    monkeypatch.setattr(CompactingPipeline, "quiet_before_call", lambda self, run: False)
    without, compactions_without = await _requests(tmp_path / "plain.db", POLICIES[policy])

    assert compactions == compactions_without
    assert with_shortcut == without
