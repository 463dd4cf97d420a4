"""End to end: the Runtime drives AnthropicModel (the real SDK) against MessagesServer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from anabranch import Agent, AnthropicModel, RetryPolicy, Runtime, tool
from anabranch.messages import ModelRequest, ModelResponse
from anabranch.runtime._history import call_usage
from anabranch.runtime._results import RunResult
from anabranch.store import CallRecord, MessageRecord
from anabranch.testing import FaultKind, FunctionModel, MessagesServer, TestModel

pytestmark = pytest.mark.anyio

LOOKUPS: list[str] = []


@tool
def lookup(topic: str) -> str:
    """Look a topic up in the research notes."""
    LOOKUPS.append(topic)
    return f"Notes on {topic}: tides follow the moon; " + "waves carry energy. " * 20


AGENT = Agent(
    name="researcher",
    model="claude-opus-4-8",
    instructions="Research carefully and cite the notes you used. " * 120,
    tools=[lookup],
)
FAST_RETRY = RetryPolicy(max_attempts=4, base_delay=0.01, max_delay=0.05)


@asynccontextmanager
async def runtime_for(srv: MessagesServer, db: Path) -> AsyncIterator[Runtime]:
    model = AnthropicModel(base_url=srv.base_url, api_key="test")
    try:
        async with Runtime(db=db, model=model, retry=FAST_RETRY) as rt:
            yield rt
    finally:
        await model.aclose()


async def stored(rt: Runtime, result: RunResult) -> tuple[list[MessageRecord], list[CallRecord]]:
    messages = await rt.store.load_messages(result.run_id)
    calls = await rt.store.session_calls(result.session_id)
    return messages, calls


def conversation(messages: list[MessageRecord]) -> list[tuple[str, Any]]:
    return [(m.role, json.loads(m.content)) for m in messages]


async def run_once(
    tmp_path: Path, policy: Any, name: str, **server: Any
) -> tuple[MessagesServer, RunResult, list[MessageRecord], list[CallRecord]]:
    LOOKUPS.clear()
    async with MessagesServer(policy, **server) as srv:
        async with runtime_for(srv, tmp_path / f"{name}.db") as rt:
            result = await rt.run(AGENT, "How do tides work?")
            messages, calls = await stored(rt, result)
    return srv, result, messages, calls


async def test_multi_turn_tool_run_through_the_sdk(tmp_path: Path) -> None:
    srv, result, messages, calls = await run_once(tmp_path, TestModel(rounds=2), "multi")
    assert result.status == "done"
    assert result.output.startswith("Report on: How do tides work?")
    assert [m.role for m in messages] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert len(LOOKUPS) == 2
    assert [r.status for r in srv.log] == [200, 200, 200]
    assert all(r.stream for r in srv.log)  # AnthropicModel streams every call
    assert [c.status for c in calls] == ["ok", "ok", "ok"]
    last_request = srv.log[-1].request
    assert last_request is not None
    assert [m.role for m in last_request.messages] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]


@pytest.mark.parametrize(
    ("kind", "error_type"),
    [
        ("rate_limit", "RateLimitedError"),
        ("overloaded", "OverloadedError"),
        ("server_error", "ServerError"),
        ("stream_error", "OverloadedError"),
        ("disconnect", "ModelConnectionError"),
    ],
)
async def test_fault_mid_run_is_retried_and_nothing_is_lost(
    tmp_path: Path, kind: FaultKind, error_type: str
) -> None:
    _, _, clean_messages, _ = await run_once(tmp_path, TestModel(rounds=2), "clean")
    clean_lookups = list(LOOKUPS)

    inner = TestModel(rounds=2)
    server: MessagesServer | None = None

    async def answer(request: ModelRequest) -> ModelResponse:
        response = await inner.request(request)
        if len(inner.requests) == 1 and server is not None:
            server.inject(kind, retry_after=0.01)  # the second model call fails once
        return response

    LOOKUPS.clear()
    async with MessagesServer(FunctionModel(answer)) as srv:
        server = srv
        async with runtime_for(srv, tmp_path / "faulted.db") as rt:
            result = await rt.run(AGENT, "How do tides work?")
            messages, calls = await stored(rt, result)

    assert result.status == "done"
    assert conversation(messages) == conversation(clean_messages)
    assert LOOKUPS == clean_lookups  # the retry did not run any tool twice
    assert [(c.turn, c.attempt, c.status, c.error_type) for c in calls] == [
        (1, 1, "ok", None),
        (2, 1, "error", error_type),
        (2, 2, "ok", None),
        (3, 1, "ok", None),
    ]
    assert [r.fault for r in srv.log] == [None, kind, None, None]


async def test_prompt_caching_shows_in_recorded_usage_on_a_long_run(tmp_path: Path) -> None:
    srv, result, _, calls = await run_once(tmp_path, TestModel(rounds=6), "cached")
    usages = [call_usage(c) for c in calls]  # zero counts are not stored: read as 0
    reads = [u.cache_read_input_tokens for u in usages]
    writes = [u.cache_creation_input_tokens for u in usages]
    assert len(calls) == 7
    assert reads[0] == 0 and writes[0] > 1024  # the long system prompt and the task are written
    assert all(r > 0 for r in reads[1:])  # every later call reads the previous turn's prefix
    assert reads == sorted(reads)  # the cached prefix grows as the conversation does
    for usage, record in zip(usages, srv.log, strict=True):
        assert record.usage is not None
        assert usage.cache_read_input_tokens == record.usage.cache_read_input_tokens
        assert usage.input_tokens == record.usage.input_tokens
    assert result.usage.cache_read_input_tokens == sum(reads)
