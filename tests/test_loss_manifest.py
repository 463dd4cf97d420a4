"""The loss manifest of a compaction: recorded on the boundary, on the span, by the CLI.

Through the real SDK against the local server: a summarizer that keeps one identifier of
the range, drops the others and adds one of its own (an inference).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from anabranch import Agent, AnthropicModel, Runtime, tool
from anabranch.context._digest import manifest, salient_terms
from anabranch.messages import Message, ModelRequest, ToolUseBlock
from anabranch.testing import FunctionModel, MessagesServer
from anabranch.testing._models import is_summary_request

from .compaction_helpers import FAST_RETRY, small_policy
from .test_rewind import anabranch

pytestmark = pytest.mark.anyio


@tool
def inspect_host(name: str) -> str:
    """Inspect one host."""
    return f"host {name}: ticket OPS-{len(name)}41 open, config /etc/{name}/app.conf; " + (
        "steady readings " * 40
    )


def _model() -> FunctionModel:
    state = {"calls": 0}

    def answer(request: ModelRequest) -> Any:
        if is_summary_request(request):
            return (
                "<summary>Inspected hosts; ticket OPS-541 is open.\n"
                "Root cause: disk quota QX-777 exceeded.</summary>"
            )
        state["calls"] += 1
        if state["calls"] > 6:
            return "All hosts inspected."
        name = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"][state["calls"] - 1]
        return [
            ToolUseBlock(id=f"toolu_h{state['calls']}", name="inspect_host", input={"name": name})
        ]

    return FunctionModel(answer)


async def test_the_manifest_names_what_the_summary_lost_and_invented(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent = Agent(
        name="ops",
        model="test-model",
        tools=[inspect_host],
        context=small_policy(window=2_000),
        max_turns=30,
    )
    db = tmp_path / "m.db"
    with anyio.fail_after(60):
        async with MessagesServer(_model()) as server:
            model = AnthropicModel(base_url=server.base_url, api_key="test")
            try:
                async with Runtime(
                    db=db, model=model, retry=FAST_RETRY, tracer_provider=provider
                ) as rt:
                    result = await rt.run(agent, "Inspect every host")
                    boundaries = await rt.store.list_boundaries(session_id=result.session_id)
            finally:
                await model.aclose()
    assert result.status == "done", result.error
    compactions = [b for b in boundaries if b.kind == "compaction" and b.status == "ok"]
    assert compactions
    found = json.loads(compactions[0].extra or "{}")["manifest"]
    assert found["removed_messages"][0] == 0 and found["tool_calls"]
    assert "OPS-541" not in found["missing"]  # kept by the summary
    assert "/etc/alpha/app.conf" in found["missing"]  # dropped by it
    assert any("QX-777" in line for line in found["inferred"])  # in no message of the range
    assert not any("OPS-541" in line for line in found["inferred"])
    # the summary lists the handles of what it replaced
    opening = json.loads(compactions[0].prefix)[0]["content"]
    assert any("<recall_handles>msg-0" in block.get("text", "") for block in opening)
    # the span carries the counts
    span = next(s for s in exporter.get_finished_spans() if s.name == "compact ops")
    attributes = dict(span.attributes or {})
    assert attributes["anabranch.compaction.removed_messages"] == len(found["removed_messages"])
    assert attributes["anabranch.compaction.missing_terms"] == len(found["missing"])
    assert attributes["anabranch.compaction.inferred_statements"] == len(found["inferred"])
    # and the CLI shows it
    listed = anabranch("compactions", result.session_id, "--db", str(db))
    assert listed.returncode == 0, listed.stderr
    assert "removed" in listed.stdout and "not in the summary" in listed.stdout
    assert "inferred (found nowhere in the range)" in listed.stdout
    full = anabranch("compactions", result.session_id, "--db", str(db), "--full")
    assert "/etc/alpha/app.conf" in full.stdout and "QX-777" in full.stdout


def test_salient_terms_pick_identifiers_numbers_paths_and_commands() -> None:
    text = "Run `make test` then $ git push; see src/app/main.py, ticket AB-12, port 8080."
    terms = salient_terms(text)
    for term in ("make test", "src/app/main.py", "AB-12", "8080"):
        assert term in terms
    assert "then" not in terms and "see" not in terms
    removed = [Message.user(text)]
    kept = manifest(removed, [3], "We ran make test on AB-12.", summary="Deployed v2.1 to AB-12.")
    assert "src/app/main.py" in kept.missing and "AB-12" not in kept.missing
    assert kept.inferred == ("Deployed v2.1 to AB-12.",)
    assert kept.removed_messages == (3,)


@pytest.mark.parametrize("notes", [True, False])
async def test_preventive_notes_are_in_the_static_prompt_unless_turned_off(
    tmp_path: Path, notes: bool
) -> None:
    from anabranch import ContextPolicy
    from anabranch.runtime._recall import PREVENTIVE_NOTE

    agent = Agent(
        name="ops",
        model="test-model",
        tools=[inspect_host],
        context=ContextPolicy(preventive_notes=notes),
    )
    with anyio.fail_after(30):
        async with MessagesServer(_model()) as server:
            model = AnthropicModel(base_url=server.base_url, api_key="test")
            try:
                async with Runtime(db=tmp_path / "p.db", model=model, retry=FAST_RETRY) as rt:
                    result = await rt.run(agent, "Inspect every host")
            finally:
                await model.aclose()
            systems = [
                " ".join(b.text for b in r.request.system)
                for r in server.log
                if r.endpoint == "messages" and r.request is not None
            ]
    assert result.status == "done"
    assert systems and all((PREVENTIVE_NOTE[:60] in s) == notes for s in systems)
