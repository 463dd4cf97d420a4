"""A tool output over the spill limit is stored once, in its ``finished`` event: the spill
that ``recall`` pages through refers to that event, and everything that reads it (recall,
history search, a next turn, ``anabranch migrate``) gets the whole output. Both backends."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from anabranch import Agent, Runtime, tool
from anabranch.errors import StoreError
from anabranch.messages import ModelRequest, TextBlock, ToolUseBlock
from anabranch.store import PostgresStore
from anabranch.store.postgres._import import import_sqlite
from anabranch.testing import FunctionModel
from tests.databases import Db, rows, whole_copies

pytestmark = pytest.mark.anyio

HEAD = "narwhal census, page one: " + " ".join(f"pod{i} counts {i * 3} whales" for i in range(900))
TAIL = " and at the very end the sunfish tally"
BIG = HEAD + TAIL
"""A ~25k-char tool output (over the default 20k spill limit); only its tail says
``sunfish``, so a search for it can match nothing but the spill."""


@tool
def census() -> str:
    """Read the census."""
    return BIG


def _model() -> FunctionModel:
    """Calls ``census``, then ``recall`` on the handle its preview names, then answers."""

    def answer(request: ModelRequest) -> list[TextBlock | ToolUseBlock] | str:
        last = request.messages[-1]
        if len(request.messages) == 1:
            return [ToolUseBlock(id="toolu_census", name="census", input={})]
        if last.tool_results and last.tool_results[0].tool_use_id == "toolu_census":
            handle = re.findall(r"recall id=(\S+?)\]", last.tool_results[0].content)[-1]
            return [ToolUseBlock(id="toolu_recall", name="recall", input={"id": handle})]
        if last.tool_results:
            return "recalled " + last.tool_results[0].content[:40]
        return "again"

    return FunctionModel(answer)


async def _run(db: Db) -> tuple[str, str, str, FunctionModel]:
    """A session whose tool output is spilled and recalled: session, run, handle, model."""
    model = _model()
    async with Runtime(db=db, model=model) as rt:
        result = await rt.run(Agent(name="clerk", tools=[census]), "count the narwhals")
        assert result.status == "done" and result.session_id and result.run_id
    handle = model.requests[2].messages[-2].tool_uses[0].input["id"]
    return result.session_id, result.run_id, str(handle), model


async def test_a_spilled_output_is_stored_once_and_read_back_whole(db: Db) -> None:
    session_id, run_id, handle, model = await _run(db)
    preview = model.requests[1].messages[-1].tool_results[0].content
    assert TAIL not in preview and f"recall id={handle}" in preview  # the context's preview
    recalled = model.requests[2].messages[-1].tool_results[0].content
    assert recalled.startswith(HEAD[:1000])  # recall paged through the whole output
    # the finished event holds it; the spill refers to it (a second copy fails here)
    assert whole_copies(db, BIG) == {"tool_events": 1}

    again = _model()
    async with Runtime(db=db, model=again) as rt:
        assert await rt.store.get_spill(handle) == BIG
        record = await rt.store.get_spill_record(handle)
        assert record is not None and (record.run_id, record.content) == (run_id, BIG)
        hits = await rt.store.search_history(run_id, "sunfish tally")
        assert [(h.source, h.ref) for h in hits] == [("spill", handle)]
        follow_up = await rt.send(session_id, "and again?", Agent(name="clerk", tools=[census]))
        assert follow_up.status == "done"
        sent = model.requests[-1].messages
        assert again.requests[0].messages[: len(sent)] == sent  # resent byte for byte
    assert whole_copies(db, BIG) == {"tool_events": 1}


async def test_migrate_keeps_a_spilled_output_stored_once(
    postgres_dsn: str, tmp_path: Path
) -> None:
    source = tmp_path / "s.db"
    _, run_id, handle, _ = await _run(source)
    import_sqlite(source, postgres_dsn)
    assert whole_copies(postgres_dsn, BIG) == {"tool_events": 1}
    store = await PostgresStore.open(postgres_dsn)
    try:
        assert await store.get_spill(handle) == BIG
        hits = await store.search_history(run_id, "sunfish")
        assert [(h.source, h.ref) for h in hits] == [("spill", handle)]
    finally:
        await store.close()


async def test_a_spill_whose_event_is_missing_is_a_clear_store_error(db: Db) -> None:
    async with Runtime(db=db, model=_model()) as rt:
        await rt.store.save_spill("spill_x", "run_x", "toolu_x", "kept whole")  # no event
        rows(
            db,
            "INSERT INTO spills (handle, run_id, call_id, content, created, event_id) "
            "VALUES ('spill_gone', 'run_x', 'toolu_gone', NULL, 1.0, 424242)",
        )
        assert await rt.store.get_spill("spill_x") == "kept whole"
        with pytest.raises(StoreError, match="spill 'spill_gone' refers to tool event 424242"):
            await rt.store.get_spill("spill_gone")
