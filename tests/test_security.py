"""The API key never lands in the store or the logs; database files are owner-only."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from anabranch import Agent, AnthropicModel, Runtime, tool
from anabranch.testing import MessagesServer, TestModel

pytestmark = pytest.mark.anyio

SECRET = "sk-ant-api03-do-not-leak-0123456789abcdef"


@tool
async def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


async def test_api_key_is_not_stored_or_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    db = tmp_path / "secret.db"
    agent = Agent(name="worker", model="claude-sonnet-5-5", tools=[lookup])
    async with MessagesServer(policy=TestModel(), api_key=SECRET) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key=SECRET)
        async with Runtime(db=db, model=model) as rt:
            result = await rt.run(agent, "find notes")
            assert result.status == "done"
            files = sorted(tmp_path.iterdir())
            for path in files:  # the database and its WAL while the runtime is open
                assert SECRET.encode() not in path.read_bytes(), path
                assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0, path
        await model.aclose()
    assert SECRET.encode() not in db.read_bytes()
    assert SECRET not in caplog.text
