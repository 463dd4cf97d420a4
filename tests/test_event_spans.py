"""What issue 16 adds to the spans: per-sub-agent spend on ``invoke_agent``, the
cross-framework ``gen_ai.compaction.*`` names, and the approval wait as a span event."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from anabranch import Agent, Runtime, tool
from anabranch.errors import ApprovalPendingError
from anabranch.messages import ModelRequest
from anabranch.runtime._views import session_view

from .compaction_helpers import small_agent
from .subagent_helpers import first_turn, use

pytestmark = pytest.mark.anyio


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def test_each_agent_span_carries_its_own_spend_and_compactions_both_names(
    tmp_path: Path,
) -> None:
    from anabranch.testing import TestModel

    provider, exporter = _provider()
    boss = Agent(name="boss", model="claude-sonnet-4-5", subagents=[small_agent("worker")])
    model = TestModel(rounds=10)
    async with Runtime(db=tmp_path / "s.db", model=model, tracer_provider=provider) as rt:
        result = await rt.run(boss, "dig")
        session = await rt.store.get_session(result.session_id)
        assert session is not None
        view = await session_view(rt.store, session)
    runs = {view.runs[0].id: view.runs[0]} | {c.id: c for c in view.runs[0].children}
    spans = exporter.get_finished_spans()
    agents = {
        (s.attributes or {})["gen_ai.agent.id"]: s
        for s in spans
        if s.name.startswith("invoke_agent")
    }
    assert set(agents) == set(runs)
    for run_id, run in runs.items():
        attributes = agents[run_id].attributes or {}
        calls_in = sum(c.usage.total_input_tokens for c in run.calls)
        assert attributes["anabranch.usage.input_tokens"] == calls_in
        calls_out = sum(c.usage.output_tokens for c in run.calls)
        assert attributes["anabranch.usage.output_tokens"] == calls_out
        if run.agent == "boss":  # priced model: a cost of its own calls only
            assert attributes["anabranch.cost.usd"] == pytest.approx(
                sum(c.cost or 0.0 for c in run.calls)
            )
    compacts = [s for s in spans if s.name.startswith("compact ")]
    assert compacts
    for span in compacts:
        a = span.attributes or {}
        for name in ("trigger", "strategy", "tokens_before", "tokens_after"):
            assert a[f"gen_ai.compaction.{name}"] == a[f"anabranch.compaction.{name}"], name
        assert a["gen_ai.compaction.event_count"] == a["anabranch.compaction.messages_before"]


@tool(needs_approval=True)
def launch() -> str:
    """Launch it."""
    return "launched"


async def test_the_approval_wait_is_a_span_event(tmp_path: Path) -> None:
    from anabranch.testing import FunctionModel

    provider, exporter = _provider()

    def answer(request: ModelRequest) -> object:
        return [use("launch", "toolu_launch")] if first_turn(request) else "ok"

    agent = Agent(name="pilot", model="m", tools=[launch])
    async with Runtime(
        db=tmp_path / "a.db", model=FunctionModel(answer), tracer_provider=provider
    ) as rt:
        result = await rt.run(agent, "go")
    assert result.status == "waiting"
    with pytest.raises(ApprovalPendingError):
        result.raise_for_status()
    events = [e for s in exporter.get_finished_spans() for e in s.events]
    waits = [e for e in events if e.name == "anabranch.approval_requested"]
    assert len(waits) == 1
    assert (waits[0].attributes or {})["gen_ai.tool.call.id"] == "toolu_launch"
