"""A run whose model changed to one with a smaller window: the previous model summarizes
its context first, then the run goes on with the new model, never refused for length.

Through the real SDK against the local server, which enforces each model's own window.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from anabranch import Agent, AnthropicModel, Runtime, tool
from anabranch.messages import ModelRequest, ToolUseBlock
from anabranch.runtime._model_switch import same_model, served_model
from anabranch.store import CallRecord, RunRecord
from anabranch.testing import FunctionModel, MessagesServer
from anabranch.testing._models import is_summary_request

from .compaction_helpers import FAST_RETRY, small_policy
from .helpers import run_until

pytestmark = pytest.mark.anyio

BIG, SMALL = "big-model", "small-model"
LIMITS = {BIG: 12_000, SMALL: 2_000}
HOSTS = [f"host{i:02d}" for i in range(14)]


def _agent(model: str, window: int, **extra: Any) -> Agent:
    return Agent(
        name="surveyor",
        model=model,
        tools=[survey],
        context=small_policy(window=window, tool_result_max_chars=2_000),
        max_turns=60,
        **extra,
    )


@tool
async def survey(host: str) -> str:
    """Survey one host."""
    if host == HOSTS[-1] and _GATE.get("hold") is not None:
        _GATE["entered"].set()
        await anyio.sleep_forever()
    return f"{host}: fact F-{host.upper()} noted; " + "steady readings " * 50


_GATE: dict[str, Any] = {}


def _policy() -> FunctionModel:
    def answer(request: ModelRequest) -> Any:
        if is_summary_request(request):
            seen = sorted({h for h in HOSTS if f"F-{h.upper()}" in str(request.messages)})
            return "<summary>Surveyed: " + ", ".join(f"F-{h.upper()}" for h in seen) + "</summary>"
        done = sum(1 for m in request.messages for b in m.tool_results)
        text = str(request.messages[-1].content)
        if "report" in text.lower() and request.messages[-1].role == "user":
            return "Report: all hosts surveyed."
        if done >= len(HOSTS) or "Surveyed:" in str(request.messages[0].content) and done:
            return "All hosts surveyed."
        host = HOSTS[done]
        return [ToolUseBlock(id=f"toolu_s{done}", name="survey", input={"host": host})]

    return FunctionModel(answer)


async def _boundaries(rt: Runtime, session_id: str) -> list[Any]:
    return [
        b
        for b in await rt.store.list_boundaries(session_id=session_id)
        if b.kind == "compaction" and b.status == "ok"
    ]


def _check_switch(server: MessagesServer, boundary: Any, after: int) -> None:
    assert all(r.status == 200 for r in server.log), [r.error_message for r in server.log]
    later = [r for r in server.log[after:] if r.endpoint == "messages"]
    summaries = [r for r in later if r.request is not None and is_summary_request(r.request)]
    assert summaries and summaries[0] is later[0], "the summary comes before the new model's call"
    assert {r.model for r in summaries} == {BIG}  # the previous model summarized
    assert all(r.model == SMALL for r in later if r not in summaries)
    assert boundary.trigger == "model_switch" and boundary.model == BIG
    switch = json.loads(boundary.extra)["model_switch"]
    assert switch["from"] == BIG and switch["to"] == SMALL and switch["summarizer"] == BIG
    assert "cannot hold the context" in switch["reason"]


async def test_a_session_resumed_on_a_smaller_model_is_summarized_by_the_previous_one(
    tmp_path: Path,
) -> None:
    _GATE.clear()
    _GATE.update(hold=True, entered=anyio.Event())
    with anyio.fail_after(60):
        async with MessagesServer(_policy(), model_limits=LIMITS) as server:
            model = AnthropicModel(base_url=server.base_url, api_key="test")
            try:
                async with Runtime(db=tmp_path / "s.db", model=model, retry=FAST_RETRY) as rt:
                    session_id = await run_until(
                        rt, _agent(BIG, 12_000), "Survey every host", _GATE["entered"]
                    )
                _GATE.clear()
                served = len(server.log)
                async with Runtime(db=tmp_path / "s.db", model=model, retry=FAST_RETRY) as rt:
                    result = await rt.resume(session_id, agent=_agent(SMALL, 2_000))
                    boundaries = await _boundaries(rt, session_id)
            finally:
                await model.aclose()
    assert result.status == "done", result.error
    assert boundaries and boundaries[0].tokens_before > 2_000 * 0.7
    _check_switch(server, boundaries[0], served)
    summary = boundaries[0].summary or ""
    assert all(f"F-{h.upper()}" in summary for h in HOSTS[:-1])  # it read the whole context


async def test_a_conversation_continued_on_a_smaller_model(tmp_path: Path) -> None:
    _GATE.clear()
    with anyio.fail_after(60):
        async with MessagesServer(_policy(), model_limits=LIMITS) as server:
            model = AnthropicModel(base_url=server.base_url, api_key="test")
            try:
                async with Runtime(db=tmp_path / "c.db", model=model, retry=FAST_RETRY) as rt:
                    first = await rt.run(_agent(BIG, 12_000), "Survey every host")
                    assert first.status == "done", first.error
                    assert not await _boundaries(rt, first.session_id)
                    served = len(server.log)
                    reply = await rt.send(
                        first.session_id, "Write the report.", agent=_agent(SMALL, 2_000)
                    )
                    boundaries = await _boundaries(rt, first.session_id)
                    # a third turn on the same small model: no switch any more
                    again = await rt.send(
                        first.session_id, "Report again.", agent=_agent(SMALL, 2_000)
                    )
            finally:
                await model.aclose()
    assert reply.status == "done" and reply.output.startswith("Report"), reply.error
    assert again.status == "done", again.error
    assert len(boundaries) == 1
    _check_switch(server, boundaries[0], served)


async def test_a_larger_window_needs_no_summary(tmp_path: Path) -> None:
    _GATE.clear()
    with anyio.fail_after(60):
        async with MessagesServer(_policy(), model_limits={BIG: 12_000, SMALL: 4_000}) as server:
            model = AnthropicModel(base_url=server.base_url, api_key="test")
            try:
                async with Runtime(db=tmp_path / "l.db", model=model, retry=FAST_RETRY) as rt:
                    first = await rt.run(_agent(SMALL, 4_000), "Survey host00 only")
                    reply = await rt.send(
                        first.session_id, "Write the report.", agent=_agent(BIG, 12_000)
                    )
                    boundaries = await _boundaries(rt, first.session_id)
            finally:
                await model.aclose()
    assert reply.status == "done", reply.error
    assert not [b for b in boundaries if b.trigger == "model_switch"]


def _call(served: str) -> CallRecord:
    return CallRecord(
        run_id="r", turn=1, attempt=1, fingerprint="f", message_count=1, created=0.0, model=served
    )


def test_an_alias_answered_with_its_dated_id_is_the_same_model() -> None:
    assert same_model("claude-x", "claude-x-20250101")
    assert not same_model("claude-x", "claude-y")
    record = RunRecord(id="r", session_id="s", agent_name="a", model="claude-x", created=0.0)
    assert served_model(record, _call("claude-x-20250101")) == "claude-x"  # as requested
    assert served_model(record, _call("claude-y")) == "claude-y"
    assert served_model(record, None) is None
