"""The shipped test models behave like a real API where tests depend on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from anabranch import Runtime
from anabranch.context._compaction import Split, verbatim_context, windowed_context
from anabranch.context._digest import dropped_note
from anabranch.messages import (
    Message,
    ModelRequest,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)
from anabranch.runtime._loader import load_object
from anabranch.testing import TestModel

from .helpers import sql

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


async def test_tool_use_ids_are_unique_across_a_multi_agent_session(tmp_path: Path) -> None:
    """Sibling sub-agents get the same task text; their tool calls must still differ
    (a shared id once made two siblings' side effects look like one call)."""
    supervisor = load_object(f"{EXAMPLES / 'research.py'}:supervisor")
    async with Runtime(db=tmp_path / "ids.db", model=TestModel()) as rt:
        result = await rt.run(supervisor, "Compare SQLite and DuckDB")
        rows = await sql(
            rt.store,
            "SELECT m.content FROM messages m JOIN runs r ON r.id = m.run_id "
            "WHERE r.session_id = ? AND m.role = 'assistant'",
            (result.session_id,),
        )
    ids = [
        block["id"]
        for row in rows
        for block in json.loads(row["content"])
        if block.get("type") == "tool_use"
    ]
    assert len(ids) >= 5
    assert len(ids) == len(set(ids))


async def test_free_text_arguments_carry_the_task(tmp_path: Path) -> None:
    supervisor = load_object(f"{EXAMPLES / 'research.py'}:supervisor")
    async with Runtime(db=tmp_path / "args.db", model=TestModel()) as rt:
        result = await rt.run(supervisor, "Compare SQLite and DuckDB")
    assert "SQLite is an embedded, serverless SQL database" in result.output


async def _rounds_left_after(strategy: str) -> list[int]:
    """Round numbers of the tool calls TestModel(rounds=5) makes after 3 rounds were
    compacted away entirely (an empty tail) by ``strategy``."""
    model = TestModel(rounds=5)
    tool = ToolDefinition(name="search", description="Search.", input_schema={"type": "object"})
    messages: list[Message] = [Message.user("Survey the river.")]
    for _ in range(3):
        reply = await model.request(
            ModelRequest(model="m", tools=(tool,), messages=tuple(messages))
        )
        uses = [b for b in reply.content if isinstance(b, ToolUseBlock)]
        messages.append(Message(role="assistant", content=tuple(uses)))
        results = tuple(ToolResultBlock(tool_use_id=u.id, content="gauge high") for u in uses)
        messages.append(Message(role="user", content=results))
    split = Split.at(messages, len(messages))
    rebuilt = (
        verbatim_context(split, "run_1")
        if strategy == "verbatim"
        else windowed_context(split, dropped_note(list(messages), list(range(7)), [], 2_000))
    )
    rest: list[int] = []
    context = list(rebuilt.messages)
    while True:
        request = ModelRequest(model="m", tools=(tool,), messages=tuple(context))
        reply = await model.request(request)
        uses = [b for b in reply.content if isinstance(b, ToolUseBlock)]
        if not uses or len(rest) > 10:
            return rest
        rest.append(int(uses[0].id.rsplit("r", 1)[1]))
        context.append(Message(role="assistant", content=tuple(uses)))
        context.append(
            Message(
                role="user",
                content=tuple(
                    ToolResultBlock(tool_use_id=u.id, content="gauge high") for u in uses
                ),
            )
        )


@pytest.mark.parametrize("strategy", ["verbatim", "window"])
async def test_the_round_count_survives_a_compaction_that_kept_no_tool_call(
    strategy: str,
) -> None:
    """A context compacted with an empty tail still tells TestModel how many rounds ran
    (a verbatim context as one-line notes of its calls): it does the rest, not all again.
    Counting from 0 again once sent an analyst round in circles until ``max_turns``."""
    assert await _rounds_left_after(strategy) == [3, 4]
