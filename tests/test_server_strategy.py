"""``strategy="server"``: the Messages API writes the summary (compaction on demand), through
the real SDK against the local server, on a model with preserved thinking: boundaries,
loss manifest and spans as for our own summaries, the kept turns' thinking still valid,
the compaction block persisted and sent back byte for byte, also after ``kill -9``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from anabranch import Agent, AnthropicModel, ModelSettings, RetryPolicy, Runtime
from anabranch.messages import ModelRequest, RawBlock
from anabranch.testing import MessagesServer, RequestRecord, TestModel
from tests.compaction_helpers import fetch, small_policy
from tests.kill_helpers import run_and_kill

pytestmark = pytest.mark.anyio


def _agent(**policy: Any) -> Agent:
    return Agent(
        name="tides",
        model="claude-opus-5-5",
        instructions="Research the topic with your tools, then report.",
        tools=[fetch],
        context=small_policy(window=2500, output_reserve=300, strategy="server", **policy),
        max_tokens=2048,
        max_turns=60,
        model_settings=ModelSettings(thinking="adaptive"),
    )


def _finished_without_a_400(result: Any, srv: MessagesServer) -> list[RequestRecord]:
    assert result.status == "done", result.error
    log = [r for r in srv.log if r.endpoint == "messages"]
    assert [r.error_message for r in log if r.status != 200] == []
    return log


def _opening(request: ModelRequest) -> dict[str, Any] | None:
    first = request.messages[0].content[0] if request.messages[0].content else None
    if isinstance(first, RawBlock) and first.block.get("type") == "compaction":
        return first.block
    return None


async def test_server_compactions_keep_the_kept_turns_thinking_and_are_traced(
    tmp_path: Path,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with MessagesServer(TestModel(rounds=20)) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="k")
        try:
            async with Runtime(
                db=tmp_path / "t.db", model=model, retry=RetryPolicy(max_attempts=1),
                tracer_provider=provider,
            ) as rt:  # fmt: skip
                with anyio.fail_after(120):
                    result = await rt.run(_agent(), "Study the tides.")
                boundaries = await rt.store.list_boundaries(run_id=result.run_id)
        finally:
            await model.aclose()
    log = _finished_without_a_400(result, srv)
    ok = [b for b in boundaries if b.status == "ok"]
    assert len(ok) >= 2 and {b.strategy for b in ok} == {"server"}
    assert all(b.summary for b in ok)
    extras = [json.loads(b.extra or "{}") for b in ok]
    assert all(e["manifest"]["removed_messages"] for e in extras)
    compactions = [r for r in log if r.compaction]
    assert len(compactions) == len(ok)
    turns = [r.request for r in log if r.request is not None and not r.compaction]
    after = [q for q in turns if _opening(q) is not None]
    assert after, "no request opened with the API's summary"
    # the model's reply kept after the summary still carries its thinking (our own summary
    # would have had to drop it on this model)
    assert any(q.messages[1].role == "assistant" and q.messages[1].thinking_blocks for q in after)
    spans = exporter.get_finished_spans()
    compact = [s for s in spans if s.name == "compact tides"]
    assert len(compact) == len(ok)
    assert {dict(s.attributes or {})["anabranch.compaction.strategy"] for s in compact} == {
        "server"
    }
    for span in compact:
        children = [s for s in spans if s.parent and s.parent.span_id == span.context.span_id]
        assert [c.name for c in children] == ["chat claude-opus-5-5"]


async def test_a_model_that_cannot_compact_on_the_server_fails_the_compaction_clearly(
    tmp_path: Path,
) -> None:
    async with Runtime(db=tmp_path / "t.db", model=TestModel(rounds=20)) as rt:
        with anyio.fail_after(120):
            result = await rt.run(_agent(on_compaction_failure="continue"), "Study the tides.")
        boundaries = await rt.store.list_boundaries(run_id=result.run_id)
    failed = [b for b in boundaries if b.status != "ok"]
    assert failed and "strategy='server' needs a model that compacts on the server" in (
        failed[0].error or ""
    )
    assert result.status == "done"  # the breaker fell back to the window strategy


AGENTS = '''
import time
from pathlib import Path
from anabranch import Agent, ModelSettings, tool
from tests.compaction_helpers import small_policy

HERE = Path(__file__).parent

@tool
def notes(topic: str) -> str:
    """Fetch notes on a topic."""
    calls = HERE / "calls"
    count = int(calls.read_text()) + 1 if calls.exists() else 1
    calls.write_text(str(count))
    if count == 9:
        (HERE / "reached").touch()
        while (HERE / "hold").exists():   # the first process is killed in here
            time.sleep(0.02)
    return f"notes {count} on {topic}: " + "lorem ipsum dolor sit amet " * 20

tides = Agent(
    name="tides", model="claude-opus-5-5",
    instructions="Research the topic with your tools, then report.",
    tools=[notes], max_tokens=2048, max_turns=60,
    context=small_policy(window=2500, output_reserve=300, strategy="server"),
    model_settings=ModelSettings(thinking="adaptive"),
)
'''


@pytest.mark.slow
async def test_server_compaction_survives_kill_9_byte_for_byte(tmp_path: Path) -> None:
    (tmp_path / "team.py").write_text(AGENTS)
    (tmp_path / "hold").touch()
    db = tmp_path / "runs.db"
    async with MessagesServer(TestModel(rounds=16)) as srv:
        target = f"{tmp_path}/team.py:tides"
        session_id = await run_and_kill(
            srv, tmp_path, target, "Study the tides.", db, what="the ninth tool call"
        )
        before = [r for r in srv.log if r.endpoint == "messages" and r.request is not None]
        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        try:
            async with Runtime(db=db, model=model) as rt:
                with anyio.fail_after(120):
                    result = await rt.resume(session_id)
                boundaries = await rt.store.list_boundaries(run_id=result.run_id)
        finally:
            await model.aclose()
    log = _finished_without_a_400(result, srv)
    assert any(r.compaction for r in before), "no server compaction before the kill"
    last_before = next(
        r.request for r in reversed(before) if not r.compaction and r.request is not None
    )
    first_after = next(
        r.request for r in log[len(before) :] if not r.compaction and r.request is not None
    )
    # the summary block the API returned goes back exactly so after the resume
    assert _opening(last_before) is not None
    assert _opening(first_after) == _opening(last_before)
    stored = [
        json.loads(b.prefix)[0]["content"][0]["block"] for b in boundaries if b.status == "ok"
    ]
    assert _opening(last_before) in stored
    assert {b.strategy for b in boundaries if b.status == "ok"} == {"server"}
