"""End to end: ``examples/long_task.py`` through the real SDK against the local Messages API.

The server enforces the API's rules (roles, tool pairing) and answers ``prompt is too
long`` above its ``context_limit``, which is set below the supervisor's own threshold so
that only reactive compaction can save the run.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from anabranch import AnthropicModel, Runtime
from anabranch.testing import MessagesServer, TestModel
from anabranch.testing._models import is_summary_request

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "long_task.py"
LIMIT = 2_300
"""Below the supervisor's threshold (2,800), above every sub-agent's (at most 2,100); the
supervisor's requests (deterministic under TestModel) land between the two, so it hits it."""


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("long_task_example", EXAMPLE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def _run_through_server(tmp_path: Path) -> tuple[Any, list[tuple[str, Any]], MessagesServer]:
    example = _example()
    async with MessagesServer(TestModel(rounds=8), context_limit=LIMIT) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        try:
            result, boundaries = await example.run_long_task(model, tmp_path / "long.db")
        finally:
            await model.aclose()
    return result, boundaries, srv


def _assert_api_accepted_everything(srv: MessagesServer) -> None:
    refused = [r for r in srv.log if r.status != 200]
    for record in refused:  # the only refusal allowed is a prompt that was too long
        assert record.status == 400 and "prompt is too long" in (record.error_message or "")
    assert refused, "the server limit should have been hit at least once"
    answered = [r for r in srv.log if r.status == 200 and r.request is not None]
    assert answered and all(r.request is not None and r.request.messages for r in answered)


async def test_long_task_recovers_prompt_too_long_through_the_sdk(tmp_path: Path) -> None:
    result, boundaries, srv = await _run_through_server(tmp_path)
    assert result.status == "done"
    _assert_api_accepted_everything(srv)
    supervisor = [b for agent, b in boundaries if agent == "supervisor"]
    assert any(b.kind == "compaction" and b.status == "ok" for b in supervisor)
    # the first refusal (the supervisor's summarizer call) taught the pipeline the limit,
    # so no later request of that model on this server was refused again
    refused = [r for r in srv.log if r.status == 400]
    assert len(refused) == 1 and refused[0].model == "claude-opus-4-8"
    # every request that reached the model afterwards fit the server's limit
    summaries = [r for r in srv.log if r.request is not None and is_summary_request(r.request)]
    assert summaries and any(r.status == 200 for r in summaries)


async def test_a_summarizer_call_reads_the_runs_prompt_cache(tmp_path: Path) -> None:
    """Proactive compaction forks the run's prompt, so the summary reads its cache."""
    from .compaction_helpers import small_agent

    agent = small_agent(window=3000).model_copy(update={"model": "claude-opus-4-8"})
    async with MessagesServer(TestModel(rounds=12), min_cache_tokens=256) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        try:
            async with Runtime(db=tmp_path / "r.db", model=model) as rt:
                result = await rt.run(agent, "Research SQLite")
        finally:
            await model.aclose()
    assert result.status == "done"
    summaries = [r for r in srv.log if r.request is not None and is_summary_request(r.request)]
    assert summaries and all(r.status == 200 for r in summaries)
    for record in summaries:
        assert (
            record.cache_read_input_tokens
            > record.input_tokens + record.cache_creation_input_tokens
        )


async def test_sub_agents_compact_at_their_own_windows_through_the_sdk(tmp_path: Path) -> None:
    result, boundaries, srv = await _run_through_server(tmp_path)
    assert result.status == "done"
    _assert_api_accepted_everything(srv)
    supervisor = [b for agent, b in boundaries if agent == "supervisor" and b.status == "ok"]
    assert len(supervisor) >= 2
    example = _example()
    windows = {a.name: a.context for a in (example.archivist, example.analyst)}
    for name, policy in windows.items():
        mine = [b for agent, b in boundaries if agent == name and b.status == "ok"]
        assert len(mine) >= 2, name
        assert all(b.strategy == policy.strategy for b in mine)
        assert all(b.tokens_before >= policy.threshold for b in mine if b.trigger == "auto")
