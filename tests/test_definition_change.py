"""A definition changed between start and resume: the tools offered and the messages agree,
and the lost prompt cache is blamed on the change."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from anabranch import Agent, Runtime, tool
from anabranch.messages import ModelRequest, ModelResponse, TextBlock, ToolUseBlock, Usage
from anabranch.testing import FunctionModel

from .helpers import run_until

pytestmark = pytest.mark.anyio

WARM = Usage(input_tokens=10, cache_creation_input_tokens=1000, output_tokens=5)
SHORT = Usage(input_tokens=900, cache_read_input_tokens=300, cache_creation_input_tokens=50)
FULL = Usage(input_tokens=10, cache_read_input_tokens=5000)


async def test_a_removed_tool_is_neither_offered_nor_listed_after_resume(tmp_path: Path) -> None:
    """Before: the stored snapshot still offered ``gone`` and the model was told
    ``Unknown tool 'gone'. Available tools: gone, keep, recall``."""
    entered = anyio.Event()
    runs: list[int] = []

    @tool
    async def keep() -> str:
        """Kept across the change."""
        runs.append(1)
        if len(runs) == 1:
            entered.set()
            await anyio.sleep_forever()
        return "kept"

    @tool
    async def gone() -> str:
        """Removed from the definition before the resume."""
        return "should not run"

    def respond(request: ModelRequest) -> ModelResponse:
        turn = sum(1 for m in request.messages if m.role == "assistant")
        if turn == 0:
            return ModelResponse(
                content=(ToolUseBlock(id="toolu_keep", name="keep", input={}),),
                stop_reason="tool_use",
                usage=WARM,
            )
        if turn == 1:
            return ModelResponse(
                content=(ToolUseBlock(id="toolu_gone", name="gone", input={}),),
                stop_reason="tool_use",
                usage=SHORT,
            )
        return ModelResponse(content=(TextBlock(text="finished"),), usage=FULL)

    model = FunctionModel(respond)
    before = Agent(name="worker", instructions="Work.", tools=[keep, gone])
    after = Agent(name="worker", instructions="Work.", tools=[keep])
    with anyio.fail_after(30):
        async with Runtime(db=tmp_path / "d.db", model=model) as rt:
            session_id = await run_until(rt, before, "task", entered)
            result = await rt.resume(session_id, after)
            breaks = await rt.store.list_cache_breaks(session_id)
            root = await rt.store.list_runs(session_id)
            snapshot = await rt.store.latest_snapshot(root[0].id)
    assert result.status == "done" and result.output == "finished"
    offered = [sorted(t.name for t in request.tools) for request in model.requests]
    assert offered[0] == ["gone", "keep", "recall"]
    assert offered[1:] == [["keep", "recall"], ["keep", "recall"]]
    told = [
        block.content
        for message in model.requests[-1].messages
        for block in message.tool_results
        if block.tool_use_id == "toolu_gone"
    ]
    assert told == ["Unknown tool 'gone'. Available tools: keep, recall."]
    assert snapshot is not None and snapshot.reason == "definition_changed"
    assert [b["cause"] for b in breaks] == ["tools_changed"]
