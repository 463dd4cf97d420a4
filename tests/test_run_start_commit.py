"""A new run's start rows and its first drive's span row commit in one transaction, and
the resume link survives a drive that fails before its first model call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import format_span_id, format_trace_id

from anabranch import Agent, Runtime
from anabranch.messages import ModelRequest, ToolUseBlock
from anabranch.runtime._context_view import ContextChange, ContextView
from anabranch.runtime._pipeline import PassThroughPipeline
from anabranch.testing import FunctionModel

from .helpers import sql, traced_store
from .span_fixtures import span_exporter, span_provider  # noqa: F401

pytestmark = pytest.mark.anyio

worker = Agent(name="worker", model="m", instructions="Work.")
boss = Agent(name="boss", model="m", instructions="Delegate.", subagents=[worker])


def _ids(span: ReadableSpan) -> tuple[str, str]:
    assert span.context is not None
    return format_trace_id(span.context.trace_id), format_span_id(span.context.span_id)


class _FailsFirstBeforeCall(PassThroughPipeline):
    """``before_call`` raises the first time: a drive that fails before its first call."""

    def __init__(self) -> None:
        self.failed = False

    async def before_call(self, run: ContextView) -> ContextChange | None:
        if not self.failed:
            self.failed = True
            raise RuntimeError("the pipeline broke before the first call")
        return None

    def quiet_before_call(self, run: ContextView) -> bool:
        return False


async def test_a_new_runs_drive_writes_its_span_row_with_its_start(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    def model(request: ModelRequest) -> Any:
        if "Delegate" in str(request.system) and len(request.messages) == 1:
            return [
                ToolUseBlock(
                    id=f"toolu_{i}", name="spawn_agent", input={"agent": "worker", "task": "go"}
                )
                for i in range(2)
            ]
        return "done"

    store, transactions = await traced_store(tmp_path / "t.db")
    try:
        rt = Runtime(store=store, model=FunctionModel(model), tracer_provider=provider)
        async with rt:
            result = await rt.run(boss, "task")
            assert result.status == "done"
            rows = await sql(store, "SELECT run_id, trace_id, span_id FROM run_spans")
            runs = await sql(store, "SELECT id FROM runs")
    finally:
        await store.close()
    starts = [t for t in transactions if any("INTO runs " in s for s in t)]
    assert len(starts) == 3 == len(runs)  # the root and its two workers
    for statements in starts:
        assert sum("INTO run_spans " in s for s in statements) == 1, statements
    assert not [
        t for t in transactions if any("INTO run_spans " in s for s in t) and t not in starts
    ], "no span row of a new run's first drive is written on its own"
    agent_spans = {
        dict(s.attributes or {}).get("gen_ai.agent.id"): _ids(s)
        for s in exporter.get_finished_spans()
        if s.name.startswith("invoke_agent")
    }
    stored = {r["run_id"]: (r["trace_id"].hex(), r["span_id"].hex()) for r in rows}
    assert stored == {r["id"]: agent_spans[r["id"]] for r in runs}


async def test_a_drive_failing_before_its_first_call_keeps_its_resume_link(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    calls: list[int] = []

    def model(request: ModelRequest) -> Any:
        calls.append(len(request.messages))
        return "final"

    rt = Runtime(
        db=tmp_path / "t.db",
        model=FunctionModel(model),
        tracer_provider=provider,
        pipeline=_FailsFirstBeforeCall(),
    )
    async with rt:
        failed = await rt.run(worker, "task")
        assert failed.status == "failed" and calls == []  # no model call was made
        first = exporter.get_finished_spans()
        assert failed.session_id is not None
        result = await rt.resume(failed.session_id)
    assert result.status == "done" and result.output == "final"
    (old_root,) = [s for s in first if s.parent is None]
    (new_root,) = [s for s in exporter.get_finished_spans()[len(first) :] if s.parent is None]
    linked = [
        (format_trace_id(k.context.trace_id), format_span_id(k.context.span_id))
        for k in new_root.links
    ]
    assert linked == [_ids(old_root)]


async def test_without_tracing_a_new_run_writes_no_span_row(tmp_path: Path) -> None:
    async with Runtime(db=tmp_path / "t.db", model=FunctionModel(lambda _: "final")) as rt:
        result = await rt.run(worker, "task")
        assert result.status == "done"
        assert await sql(rt.store, "SELECT * FROM run_spans") == []
        assert len(await sql(rt.store, "SELECT * FROM runs")) == 1
