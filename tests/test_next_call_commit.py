"""The next model call's row committed with a tool turn's last result, and when not.

The loop skips the pipeline's ``before_call`` for that call only on the pipeline's own
word (``quiet_before_call``), and only from a class that defines both: a subclass that
overrides ``before_call`` alone must see every call."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from anabranch import Agent, Runtime, tool
from anabranch.messages import ModelRequest, TextBlock, ToolUseBlock
from anabranch.runtime._builtins import ToolOutcome
from anabranch.runtime._context_view import ContextChange, ContextView, Ingested
from anabranch.runtime._pipeline import PassThroughPipeline, plain_twin
from anabranch.testing import FunctionModel

pytestmark = pytest.mark.anyio


class _SeesCalls(PassThroughPipeline):
    """Overrides ``before_call`` alone: the inherited ``quiet_before_call`` no longer
    speaks for it."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    async def before_call(self, run: ContextView) -> ContextChange | None:
        self.seen.append(len(run.context))
        return None


class _OwnIngest(PassThroughPipeline):
    async def ingest(self, run: ContextView, call: ToolUseBlock, outcome: ToolOutcome) -> Ingested:
        return Ingested(outcome)


class _Quiet(PassThroughPipeline):
    async def before_call(self, run: ContextView) -> ContextChange | None:
        return None

    def quiet_before_call(self, run: ContextView) -> bool:
        return True


def test_a_twin_counts_only_from_the_class_that_defines_both() -> None:
    assert plain_twin(PassThroughPipeline(), "before_call", "quiet_before_call") is not None
    assert plain_twin(PassThroughPipeline(), "ingest", "ingest_now") is not None
    assert plain_twin(_SeesCalls(), "before_call", "quiet_before_call") is None
    assert plain_twin(_SeesCalls(), "ingest", "ingest_now") is not None  # ingest untouched
    assert plain_twin(_OwnIngest(), "ingest", "ingest_now") is None
    assert plain_twin(_Quiet(), "before_call", "quiet_before_call") is not None
    assert plain_twin(object(), "before_call", "quiet_before_call") is None


def _steps(count: int) -> FunctionModel:
    def answer(request: ModelRequest) -> list[TextBlock | ToolUseBlock] | str:
        done = sum(len(m.tool_results) for m in request.messages)
        if done >= count:
            return "done"
        return [ToolUseBlock(id=f"toolu_{done}", name="step", input={})]

    return FunctionModel(answer)


@tool
def step() -> str:
    """One step."""
    return "ok"


async def test_a_pipeline_overriding_before_call_alone_sees_every_call(tmp_path: Path) -> None:
    pipeline = _SeesCalls()
    agent = Agent(name="a", tools=[step])
    with anyio.fail_after(20):
        async with Runtime(tmp_path / "db", model=_steps(3), pipeline=pipeline) as rt:
            result = await rt.run(agent, "go")
            calls = await rt.store.list_calls(result.run_id or "")
    assert result.output == "done"
    assert pipeline.seen == [1, 3, 5, 7]  # before each of the four calls
    assert [c.status for c in calls] == ["ok"] * 4


async def test_a_quiet_pipeline_commits_each_next_call_with_the_last_result(
    tmp_path: Path,
) -> None:
    agent = Agent(name="a", tools=[step])
    with anyio.fail_after(20):
        async with Runtime(tmp_path / "db", model=_steps(3), pipeline=_Quiet()) as rt:
            store = rt.store
            begun: list[bool] = []
            original = store.begin_call

            async def begin_call(*args: object, **kwargs: object) -> int:
                begun.append(kwargs.get("tool_event") is not None)
                return await original(*args, **kwargs)  # type: ignore[arg-type]

            store.begin_call = begin_call  # type: ignore[method-assign]
            result = await rt.run(agent, "go")
            calls = await store.list_calls(result.run_id or "")
    assert result.output == "done"
    assert begun == [False, True, True, True]  # the first call alone, then each with a result
    assert [(c.turn, c.status, c.message_count) for c in calls] == [
        (1, "ok", 1),
        (2, "ok", 3),
        (3, "ok", 5),
        (4, "ok", 7),
    ]
