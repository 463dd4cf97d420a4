"""Session usage counts every paid token: agent turns and compaction summarizer calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from anabranch import Runtime, Usage
from anabranch.runtime._loader import load_object
from anabranch.testing import TestModel

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

pytestmark = pytest.mark.anyio


async def test_summarizer_tokens_are_part_of_session_usage(tmp_path: Path) -> None:
    supervisor = load_object(f"{EXAMPLES / 'long_task.py'}:supervisor")
    async with Runtime(db=tmp_path / "acc.db", model=TestModel(rounds=8)) as rt:
        result = await rt.run(supervisor, "Audit the archive")
        calls = await rt.store.session_calls(result.session_id)
        boundaries = await rt.store.list_boundaries(session_id=result.session_id)
    agent_calls = Usage()
    for call in calls:
        if call.status == "ok" and call.usage:
            agent_calls = agent_calls + Usage.model_validate_json(call.usage)
    summarizers = [
        Usage.model_validate(json.loads(b.extra)["usage"])
        for b in boundaries
        if b.extra and "usage" in json.loads(b.extra)
    ]
    assert summarizers, "the summarize strategy should have called the summarizer"
    expected = agent_calls
    for usage in summarizers:
        expected = expected + usage
    assert result.usage == expected
    assert result.usage.output_tokens > agent_calls.output_tokens
