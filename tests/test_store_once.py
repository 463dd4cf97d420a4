"""A finished tool's output is stored once, in its ``finished`` event: the results message
refers to that event, and everything that reads the run (resume, a next turn, history
search, the transcript) gets the whole result back. On both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from anabranch import Agent, Runtime, tool
from anabranch.errors import StoreError
from anabranch.messages import ModelRequest, TextBlock, ToolUseBlock
from anabranch.runtime._history import load_messages, messages_for
from anabranch.runtime._transcript import render_transcript, run_transcript
from anabranch.store import MessageRecord
from anabranch.testing import FunctionModel
from tests.databases import Db, whole_copies

pytestmark = pytest.mark.anyio

PAYLOAD = "walrus ledger, entry " + " ".join(f"tusk{i} weighs {i * 7} grams" for i in range(120))
"""A tool output (~2.7k chars) no other part of a run says."""


@tool
def ledger() -> str:
    """Read the ledger."""
    return PAYLOAD


def _model() -> FunctionModel:
    def answer(request: ModelRequest) -> list[TextBlock | ToolUseBlock] | str:
        last = request.messages[-1]
        if last.tool_results:
            return "read " + str(len(last.tool_results[0].content))
        if len(request.messages) == 1:
            return [ToolUseBlock(id="toolu_ledger", name="ledger", input={})]
        return "again"

    return FunctionModel(answer)


async def test_a_tool_output_is_stored_once_and_read_back_whole(db: Db) -> None:
    agent = Agent(name="clerk", tools=[ledger])
    model = _model()
    async with Runtime(db=db, model=model) as rt:
        result = await rt.run(agent, "read the ledger")
        assert result.status == "done" and result.session_id and result.run_id
        sent = model.requests[-1].messages  # the live run's context, result included
        assert sent[-1].tool_results[0].content == PAYLOAD
    # the finished event holds it; the results message only refers to it
    assert whole_copies(db, PAYLOAD) == {"tool_events": 1}

    again = _model()
    async with Runtime(db=db, model=again) as rt:
        _, stored = await load_messages(rt.store, result.run_id)
        assert stored[:-1] == list(sent)  # then the answer
        # a next turn sends the stored context again, byte for byte
        follow_up = await rt.send(result.session_id, "and again?", agent)
        assert follow_up.status == "done"
        assert again.requests[0].messages[: len(sent)] == sent
        # history search finds the output in the message that refers to it
        hits = await rt.store.search_history(result.run_id, "tusk117 weighs")
        assert [(h.source, h.ref) for h in hits] == [("message", "2")]
        shown = render_transcript(await run_transcript(rt.store, result.run_id))
        assert "walrus ledger, entry tusk0 weighs 0 grams" in shown
    assert whole_copies(db, PAYLOAD) == {"tool_events": 1}


async def test_a_result_the_pipeline_changed_is_stored_as_sent(tmp_path: Path) -> None:
    big = "x" * 30_000 + " the end"

    @tool
    def dump() -> str:
        """Dump everything."""
        return big

    def answer(request: ModelRequest) -> list[TextBlock | ToolUseBlock] | str:
        if request.messages[-1].tool_results:
            return "done"
        return [ToolUseBlock(id="toolu_dump", name="dump", input={})]

    model = FunctionModel(answer)
    async with Runtime(db=tmp_path / "s.db", model=model) as rt:
        result = await rt.run(Agent(name="a", tools=[dump]), "dump")
        assert result.run_id is not None
        _, stored = await load_messages(rt.store, result.run_id)
    preview = model.requests[-1].messages[-1].tool_results[0].content
    assert preview != big and "recall" in preview  # cut to a preview with a handle
    assert stored[-2].tool_results[0].content == preview


async def test_a_reference_without_its_event_is_a_clear_store_error(tmp_path: Path) -> None:
    async with Runtime(db=tmp_path / "s.db", model=_model()) as rt:
        record = MessageRecord(
            run_id="run_missing",
            seq=0,
            role="user",
            content='[{"ref":"tool_event","tool_use_id":"toolu_gone","type":"tool_result"}]',
        )
        with pytest.raises(StoreError, match="toolu_gone.*no finished event"):
            await messages_for(rt.store, [record])
