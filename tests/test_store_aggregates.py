"""Counts and usage sums computed in SQL agree with the rows they summarize."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from anabranch import Agent, Runtime, Usage, tool
from anabranch.runtime._loop import AgentRun
from anabranch.store import BoundaryRecord
from anabranch.testing import TestModel

pytestmark = pytest.mark.anyio


@tool
def probe(topic: str) -> str:
    """Probe a topic."""
    return f"probed {topic}"


async def test_usage_and_call_counts_match_the_call_rows(tmp_path: Path) -> None:
    agent = Agent(name="a", tools=[probe])
    async with Runtime(tmp_path / "db", model=TestModel(rounds=3)) as rt:
        first = await rt.run(agent, "one")
        await rt.run(agent, "two")
        calls = await rt.store.session_calls(first.session_id)
        expected = Usage()
        for call in calls:
            if call.status == "ok" and call.usage:
                expected = expected + Usage.model_validate_json(call.usage)
        assert await rt.session_usage(first.session_id) == expected == first.usage
        assert expected.input_tokens > 0 and expected.output_tokens > 0
        assert await rt.session_usage(first.session_id, run_id=first.run_id) == expected
        assert await rt.session_usage(first.session_id, run_id="run_none") == Usage()
        assert await rt.store.count_calls(first.run_id) == 4 == len(calls)
        assert await rt.store.count_calls(first.run_id, "error") == 0
        assert await rt.store.last_ok_turn(first.run_id) == 4
        assert await rt.store.last_ok_turn("run_none") == 0


async def test_a_loaded_run_counts_turns_and_compactions(tmp_path: Path) -> None:
    agent = Agent(name="a", tools=[probe])
    async with Runtime(tmp_path / "db", model=TestModel(rounds=2)) as rt:
        result = await rt.run(agent, "task")
        record = await rt.store.get_run(result.run_id)
        assert record is not None
        for _ in range(2):
            await rt.store.add_boundary(
                BoundaryRecord(
                    run_id=result.run_id,
                    kind="compaction",
                    prefix=json.dumps(
                        [{"role": "user", "content": [{"type": "text", "text": "summary"}]}]
                    ),
                    ranges=json.dumps([[0, None]]),
                    created=time.time(),
                )
            )
        loaded = await AgentRun.load(rt.environment(result.session_id), agent, record)
    assert loaded.turns == 3
    assert loaded.compactions == 2
    assert loaded.context[0].text == "summary"


async def test_usage_keys_must_be_identifiers(tmp_path: Path) -> None:
    async with Runtime(tmp_path / "db", model=TestModel()) as rt:
        with pytest.raises(ValueError):
            await rt.store.sum_call_usage("ses", ["input_tokens') FROM x; --"])


async def test_run_spans_limit_returns_the_latest_oldest_first(tmp_path: Path) -> None:
    async with Runtime(tmp_path / "db", model=TestModel()) as rt:
        for index in range(20):
            await rt.store.add_run_span("ses", "run_1", f"{index:032x}", f"{index:016x}")
        latest = await rt.store.run_spans("run_1", limit=8)
        every = await rt.store.run_spans("run_1")
    assert [int(t, 16) for t, _ in latest] == list(range(12, 20))
    assert [int(t, 16) for t, _ in every] == list(range(20))
