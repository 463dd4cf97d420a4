"""A forked child reads the parent's prompt cache; a fresh child does not (real SDK
against the local Messages API server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from anabranch import Agent, AnthropicModel, Runtime
from anabranch.messages import ModelRequest, Usage
from anabranch.testing import FunctionModel, MessagesServer

from .subagent_helpers import first_turn, runs_by_agent, spawn

pytestmark = pytest.mark.anyio

FORK_MARKER = "You are now a forked sub-agent"


def _policy(request: ModelRequest) -> object:
    if FORK_MARKER in request.messages[-1].text:
        return "fork report"
    if request.model == "claude-haiku-5-5":
        return "fresh report"
    if first_turn(request):
        return [
            spawn("checker", "check the plan", mode="fork", call_id="toolu_fork"),
            spawn("scout", "scout the area", call_id="toolu_fresh"),
        ]
    return "final answer"


async def _first_call_usage(rt: Runtime, run_id: str) -> Usage:
    calls = await rt.store.list_calls(run_id)
    assert calls and calls[0].usage is not None
    return Usage.model_validate_json(calls[0].usage)


async def test_fork_reads_the_parents_cached_prefix(tmp_path: Path) -> None:
    checker = Agent(name="checker", model="claude-haiku-5-5", description="Checks plans.")
    scout = Agent(name="scout", model="claude-haiku-5-5", instructions="Scout.")
    boss = Agent(
        name="boss",
        model="claude-opus-4-8",
        instructions="Plan the work carefully, then delegate the checking. " * 120,
        subagents=[checker, scout],
    )
    async with MessagesServer(FunctionModel(_policy)) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        try:
            async with Runtime(db=tmp_path / "cache.db", model=model) as rt:
                result = await rt.run(boss, "Plan a trip to the coast.")
                runs = await runs_by_agent(rt.store, result.session_id)
                parent = await _first_call_usage(rt, runs["boss"][0].id)
                fork = await _first_call_usage(rt, runs["checker"][0].id)
                fresh = await _first_call_usage(rt, runs["scout"][0].id)
        finally:
            await model.aclose()
    assert result.status == "done" and result.output == "final answer"
    assert runs["checker"][0].mode == "fork" and runs["checker"][0].model == "claude-opus-4-8"
    assert parent.cache_read_input_tokens == 0 and parent.cache_creation_input_tokens > 0
    # the fork's whole inherited prefix (everything the parent sent) comes from the cache
    assert fork.cache_read_input_tokens == parent.total_input_tokens
    assert fresh.cache_read_input_tokens == 0
    served = [r for r in srv.log if r.endpoint == "messages" and r.request is not None]
    fork_served = [r for r in served if FORK_MARKER in r.request.messages[-1].text]  # type: ignore[union-attr]
    assert fork_served and fork_served[0].cache_read_input_tokens == parent.total_input_tokens
