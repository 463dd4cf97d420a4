"""Through a real LiteLLM proxy (its own venv, 127.0.0.1) in front of the local Messages API.

One proxy serves the module, with two model groups:

- ``claude-sonnet-5-5`` to a clean upstream, with a window enforced by the gateway itself
  (``model_info.max_input_tokens`` + ``enable_pre_call_checks``) far below the agents'
  declared ones: a supervisor with compacting sub-agents must still finish with every
  sub-agent done and its findings in the answer, and a later session on the same database
  must start with the limit learned;
- ``claude-haiku-4-5`` to an upstream that fails, with LiteLLM's default retries left on:
  upstream attempts per model call stay within ``RetryPolicy.max_attempts``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from pydantic import Field

from anabranch import Agent, ContextPolicy, RetryPolicy, Runtime, ToolContext, tool
from anabranch.errors import OverloadedError, RunFailedError
from anabranch.messages import ModelRequest, ModelResponse
from anabranch.models import AnthropicModel
from anabranch.testing import FunctionModel, MessagesServer, TestModel

from .litellm_proxy import MASTER_KEY, Deployment, running_proxy

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

GATEWAY_WINDOW = 2_000
"""The gateway's ``max_input_tokens``: a fortieth of the smallest declared window."""
WINDOWED = "claude-sonnet-5-5"
FINDING = re.compile(r"FINDING (?:archivist|analyst) \w+")
FAILING = "claude-haiku-4-5"
FLAKY = "claude-opus-4-8"


def _per_agent_policy() -> FunctionModel:
    """The supervisor delegates once to each sub-agent; each sub-agent reads 12 rounds."""
    supervisor = TestModel(rounds=1, report_chars=4_000)  # quotes each report whole
    worker = TestModel(rounds=12)

    def answer(request: ModelRequest) -> Awaitable[ModelResponse]:
        delegating = any("Delegate" in block.text for block in request.system)
        return (supervisor if delegating else worker).request(request)

    return FunctionModel(answer)


@dataclass
class Gateway:
    base_url: str
    clean: MessagesServer
    failing: MessagesServer
    flaky: MessagesServer
    log_path: Path


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    workdir = tmp_path_factory.mktemp("litellm")
    portal: BlockingPortal
    with start_blocking_portal() as portal:
        clean_cm = portal.wrap_async_context_manager(MessagesServer(_per_agent_policy()))
        failing_cm = portal.wrap_async_context_manager(
            MessagesServer(TestModel(), fault_rate=1.0, fault_kinds=["overloaded"])
        )
        flaky_cm = portal.wrap_async_context_manager(
            MessagesServer(
                TestModel(rounds=4),
                fault_rate=0.2,
                seed=2,  # faults at the 3rd, 5th, 9th and 10th upstream calls
                fault_kinds=["overloaded", "server_error", "rate_limit"],
                retry_after=0.2,
            )
        )
        with clean_cm as clean, failing_cm as failing, flaky_cm as flaky:
            deployments = [
                Deployment(WINDOWED, clean.base_url, max_input_tokens=GATEWAY_WINDOW),
                Deployment(FAILING, failing.base_url),
                Deployment(FLAKY, flaky.base_url),
            ]
            with running_proxy(deployments, workdir) as proxy:
                yield Gateway(proxy.base_url, clean, failing, flaky, proxy.log_path)


@tool
async def read_chapter(
    chapter: Annotated[int, Field(description="Chapter number, from 1", ge=1)], ctx: ToolContext
) -> str:
    """Read one chapter of the survey archive (long)."""
    return f"FINDING archivist {ctx.call_id[-8:]}. " + "The river bank silted at the ford. " * 40


@tool
async def search_ledger(
    words: Annotated[str, Field(description="Words to look for")], ctx: ToolContext
) -> str:
    """Search the survey ledger."""
    return f"FINDING analyst {ctx.call_id[-8:]}. " + "The gauge read high after the flood. " * 40


def _policy(window: int, strategy: str = "summarize", max_chars: int = 1_200) -> ContextPolicy:
    return ContextPolicy(
        window=window,
        compact_at=0.7,
        output_reserve=300,
        keep_recent=4,
        strategy=strategy,
        tool_result_max_chars=max_chars,
        tool_result_preview_chars=500,
    )


def _supervisor() -> Agent:
    archivist = Agent(
        name="archivist",
        model=WINDOWED,
        instructions="Read the archive and report what you found.",
        tools=[read_chapter],
        context=_policy(100_000),
        max_turns=40,
    )
    analyst = Agent(
        name="analyst",
        model=WINDOWED,
        instructions="Search the ledger and report what you found.",
        tools=[search_ledger],
        context=_policy(100_000, "verbatim"),
        max_turns=40,
    )
    return Agent(
        name="supervisor",
        model=WINDOWED,
        instructions="Delegate to the archivist and the analyst, then write the answer.",
        subagents=[archivist, analyst],
        context=_policy(200_000, max_chars=4_000),  # each report enters whole
        max_turns=40,
    )


FAST = RetryPolicy(max_attempts=6, base_delay=0.0, max_delay=0.0, throttled_base_delay=0.0)


def _refusals(gateway: Gateway) -> int:
    """Requests the proxy refused with 400 (its access log), e.g. by its pre-call check."""
    log = gateway.log_path.read_text(errors="replace")
    return sum(1 for line in log.splitlines() if '"POST /v1/messages' in line and '" 400' in line)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_supervisor_behind_a_gateway_window_finishes_with_every_finding(
    gateway: Gateway, tmp_path: Path
) -> None:
    db = tmp_path / "gw.db"
    model = AnthropicModel(base_url=gateway.base_url, api_key=MASTER_KEY)
    before = len(gateway.clean.log)
    try:
        with anyio.fail_after(240):
            async with Runtime(db=db, model=model, retry=FAST) as rt:
                result = await rt.run(_supervisor(), "Survey the river.")
                runs = await rt.store.list_runs(result.session_id)
                boundaries = await rt.store.list_boundaries(session_id=result.session_id)
    finally:
        await model.aclose()
    assert result.status == "done", result.error
    children = [r for r in runs if r.parent_run_id is not None]
    assert {r.agent_name for r in children} == {"archivist", "analyst"}
    assert all(r.status == "done" for r in children), [(r.agent_name, r.error) for r in children]
    answer = " ".join(result.output.split())
    for child in children:  # the findings each sub-agent reported reached the answer
        findings = FINDING.findall(child.output or "")
        assert findings and all(f in answer for f in findings), (child.agent_name, answer)
    assert model.gateway == "litellm"
    # the gateway refused at its window; the runs compacted (reactively, then in time)
    triggers = {b.trigger for b in boundaries if b.kind == "compaction" and b.status == "ok"}
    assert "reactive" in triggers and "auto" in triggers
    upstream = gateway.clean.log[before:]
    assert upstream and all(r.status == 200 for r in upstream)
    refusals = _refusals(gateway)
    assert refusals > 0

    # the next session, in a fresh runtime, starts with the limit the first one learned
    model = AnthropicModel(base_url=gateway.base_url, api_key=MASTER_KEY)
    try:
        with anyio.fail_after(240):
            async with Runtime(db=db, model=model, retry=FAST) as rt:
                again = await rt.run(_supervisor(), "Survey the river.")
                limits = await rt.store.run_context_limits(again.session_id)
                runs = await rt.store.list_runs(again.session_id)
    finally:
        await model.aclose()
    assert again.status == "done"
    assert {r.run_id for r in limits} == {r.id for r in runs}
    assert all(r.source == "learned" and r.maximum == GATEWAY_WINDOW for r in limits)
    assert _refusals(gateway) == refusals, "a later session was refused again"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_sustained_fault_through_the_gateway_is_not_amplified(
    gateway: Gateway, tmp_path: Path
) -> None:
    """LiteLLM retries twice by default: 2 attempts of ours make 6 upstream, not 18."""
    agent = Agent(name="worker", model=FAILING, instructions="Answer.", context=_policy(50_000))
    model = AnthropicModel(base_url=gateway.base_url, api_key=MASTER_KEY)
    before = len(gateway.failing.log)
    try:
        with anyio.fail_after(120):
            async with Runtime(db=tmp_path / "f.db", model=model, retry=FAST) as rt:
                with pytest.raises(RunFailedError) as failed:
                    (await rt.run(agent, "Hello")).raise_for_status()
    finally:
        await model.aclose()
    cause = failed.value.__cause__
    assert isinstance(cause, OverloadedError)
    assert cause.gateway == "litellm" and cause.status_code == 500
    upstream = len(gateway.failing.log) - before
    assert upstream <= FAST.max_attempts, upstream
    assert upstream >= 2  # the gateway did retry beneath us, and so did we


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_fault_rate_of_one_in_five_through_the_gateway_stays_within_the_bound(
    gateway: Gateway, tmp_path: Path
) -> None:
    """Faults on a fifth of the upstream calls: the session finishes, and no model call
    reached the upstream more than ``max_attempts`` times (LiteLLM's retries included)."""
    agent = Agent(
        name="worker",
        model=FLAKY,
        instructions="Research the topic with your tools, then report.",
        tools=[search_ledger],
        context=_policy(50_000),
    )
    model = AnthropicModel(base_url=gateway.base_url, api_key=MASTER_KEY)
    before = len(gateway.flaky.log)
    try:
        with anyio.fail_after(180):
            async with Runtime(db=tmp_path / "flaky.db", model=model, retry=FAST) as rt:
                result = await rt.run(agent, "Survey the ledger")
                calls = await rt.store.session_calls(result.session_id)
    finally:
        await model.aclose()
    assert result.status == "done", result.error
    served = gateway.flaky.log[before:]
    faulted = [r for r in served if r.fault is not None]
    assert faulted, "the seeded plan should have failed some upstream calls"
    turns = {(c.run_id, c.turn) for c in calls}
    assert len(served) <= FAST.max_attempts * len(turns), (len(served), len(turns))
