"""The shipped test models behave like a real API where tests depend on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from anabranch import Runtime
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
