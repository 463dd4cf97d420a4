"""The next model call's row committed with a tool turn's last result, and when not.

The loop skips the pipeline's ``before_call`` for that call only on the pipeline's own
word (``quiet_before_call``), and only from a class that defines both: a subclass that
overrides ``before_call`` alone must see every call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pydantic
import pytest

from anabranch import Agent, Runtime, tool
from anabranch.messages import ModelRequest, TextBlock, ToolUseBlock
from anabranch.runtime._builtins import ToolOutcome
from anabranch.runtime._context_view import ContextChange, ContextView, Ingested
from anabranch.runtime._pipeline import PassThroughPipeline, plain_twin
from anabranch.testing import FunctionModel

from .helpers import traced_store

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


class _StaticQuiet(PassThroughPipeline):
    async def before_call(self, run: ContextView) -> ContextChange | None:
        return None

    @staticmethod
    def quiet_before_call(run: ContextView) -> bool:
        return False


def test_a_twin_is_called_with_its_pipeline_as_getattr_finds_it() -> None:
    # the class's own function (one for every run, no bound method per run) ...
    twin = plain_twin(_Quiet(), "before_call", "quiet_before_call")
    assert twin is _Quiet.quiet_before_call
    view: Any = object()
    assert twin(_Quiet(), view) is True
    # ... or, for any other kind of attribute, what ``getattr`` on the pipeline finds
    static = plain_twin(_StaticQuiet(), "before_call", "quiet_before_call")
    assert static is not None and static(_StaticQuiet(), view) is False
    own = _Quiet()
    own.quiet_before_call = lambda run: False  # type: ignore[method-assign]
    shadowed = plain_twin(own, "before_call", "quiet_before_call")
    assert shadowed is not None and shadowed(own, view) is False


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
            begun: list[str] = []
            original, start = store.begin_call, store.create_run

            async def begin_call(*args: object, **kwargs: object) -> int:
                begun.append("result" if kwargs.get("tool_event") is not None else "alone")
                return await original(*args, **kwargs)  # type: ignore[arg-type]

            async def create_run(*args: object, **kwargs: object) -> int:
                begun.append("start" if kwargs.get("call") is not None else "no call")
                return await start(*args, **kwargs)  # type: ignore[arg-type]

            store.begin_call = begin_call  # type: ignore[method-assign]
            store.create_run = create_run  # type: ignore[method-assign]
            result = await rt.run(agent, "go")
            calls = await store.list_calls(result.run_id or "")
    assert result.output == "done"
    # the first call with the run's start rows, then each with the last result
    assert begun == ["start", "result", "result", "result"]
    assert [(c.turn, c.status, c.message_count) for c in calls] == [
        (1, "ok", 1),
        (2, "ok", 3),
        (3, "ok", 5),
        (4, "ok", 7),
    ]


class _QuietAwaitingIngest(_Quiet):
    """Its ``ingest`` awaits (no ``ingest_now``): results go the usual way, each alone."""

    async def ingest(self, run: ContextView, call: ToolUseBlock, outcome: ToolOutcome) -> Ingested:
        await anyio.lowlevel.checkpoint()
        return Ingested(outcome)


def _holding(transactions: list[list[str]], *inserts: str) -> list[list[str]]:
    return [t for t in transactions if all(any(i in s for s in t) for i in inserts)]


async def test_a_results_message_built_with_awaits_commits_with_the_next_call(
    tmp_path: Path,
) -> None:
    store, transactions = await traced_store(tmp_path / "db")
    agent = Agent(name="a", tools=[step])
    with anyio.fail_after(20):
        async with Runtime(store=store, model=_steps(2), pipeline=_QuietAwaitingIngest()) as rt:
            result = await rt.run(agent, "go")
    await store.close()
    assert result.output == "done"
    # each result alone (committed as it finished), then its results message with the
    # next call's row (write-ahead: before that call is sent)
    finished = "'finished'"
    results = [t for t in _holding(transactions, "INSERT INTO tool_events") if finished in str(t)]
    assert len(results) == 2
    statements = [s for t in results for s in t]
    assert not any("INSERT INTO messages" in s or "INSERT INTO calls" in s for s in statements)
    # (and the first call's row with the run's start rows and task)
    assert len(_holding(transactions, "INSERT INTO messages", "INSERT INTO calls")) == 3
    assert len(_holding(transactions, "INSERT INTO runs", "INSERT INTO calls")) == 1


@pytest.mark.parametrize("output_type", [None, "json"])
async def test_an_answer_commits_with_its_run_end(tmp_path: Path, output_type: str | None) -> None:
    class Answer(pydantic.BaseModel):
        text: str

    def answer(request: ModelRequest) -> str:
        return '{"text": "done"}'

    store, transactions = await traced_store(tmp_path / "db")
    agent = Agent(name="a", output_type=Answer if output_type else None)
    with anyio.fail_after(20):
        async with Runtime(store=store, model=FunctionModel(answer)) as rt:
            result = await rt.run(agent, "go")
            run = await store.get_run(result.run_id or "")
    await store.close()
    assert run is not None and run.status == "done"
    ends = _holding(transactions, "INSERT INTO run_ends")
    assert len(ends) == 1
    with_answer = any("INSERT INTO call_outcomes" in s for s in ends[0])
    # an answer taken as it is ends the run in its own transaction; one to validate first
    # ends it once validated, as before
    assert with_answer == (output_type is None)
