"""What a run holds while its model call waits (issue 12: CPU per model call).

Whatever the loop keeps alive across a model's latency outlives the cyclic GC's young
generations and is walked again by every full collection, so the loop keeps no wrapper
or record per call there: no ``partial`` or extra bound method of the run, no cache-watch
or limits record made for the call, one shared value for a turn without notes.
"""

from __future__ import annotations

import functools
import gc
import types
from pathlib import Path

import pytest

from anabranch import Agent, ContextPolicy, Runtime, tool
from anabranch.messages import Block, Message, ModelRequest, TextBlock
from anabranch.runtime._cache_watch import _OkCall
from anabranch.runtime._compactor import CompactingPipeline
from anabranch.runtime._context_view import ContextChange, ContextView
from anabranch.runtime._loop import AgentRun
from anabranch.runtime._model_calls import ModelCalls
from anabranch.runtime._pipeline import PassThroughPipeline
from anabranch.runtime._run_events import RunEvents
from anabranch.runtime._run_limits import NO_NOTES, Spend, TurnNotes
from anabranch.runtime._tool_calls import ToolCalls
from anabranch.store import CallRecord, MessageRecord, SnapshotRecord
from anabranch.testing import FunctionModel
from anabranch.traces._current import CurrentSpan

from .helpers import call

pytestmark = pytest.mark.anyio

TURNS = 5


@tool
async def note(text: str) -> str:
    """Record a note."""
    return f"noted: {text}"


def _held_by_the_loop() -> dict[str, object]:
    """What the loop's own per-call objects look like right now (after a full collection)."""
    gc.collect()
    objects = gc.get_objects()
    model_call_coroutines = sorted(
        o.cr_code.co_qualname
        for o in objects
        if isinstance(o, types.CoroutineType)
        and o.cr_code.co_filename.endswith(
            ("runtime/_model_calls.py", "runtime/_loop.py", "models/_retry.py")
        )
        and o.cr_code.co_qualname not in ("AgentRun.drive", "AgentRun._loop")
    )
    run_methods = sorted(
        o.__func__.__name__
        for o in objects
        if isinstance(o, types.MethodType) and isinstance(o.__self__, AgentRun)
    )
    # what the run asks of its pipeline and events, called as functions: none bound per run
    helper_methods = sorted(
        o.__func__.__name__
        for o in objects
        if isinstance(o, types.MethodType)
        and isinstance(o.__self__, CompactingPipeline | RunEvents)
    )
    partials = [
        o
        for o in objects
        if isinstance(o, functools.partial)
        and isinstance(o.func, types.MethodType)
        and isinstance(o.func.__self__, AgentRun)
    ]
    return {
        "coroutines": model_call_coroutines,
        "run_methods": run_methods,
        "helper_methods": helper_methods,
        "partials": len(partials),
        "ok_calls": sum(1 for o in objects if isinstance(o, _OkCall)),
        # the call's own row; the previous call's is not kept (its values are)
        "call_rows": sum(1 for o in objects if isinstance(o, CallRecord)),
        # the run's and the call's spans are held as the span and its token: no
        # ``CurrentSpan`` and bound ``__exit__`` (the limits' ``driving`` is a flag)
        "span_holders": sum(1 for o in objects if isinstance(o, CurrentSpan)),
        # the previous response's record (its message, calls, marked ids): not kept by
        # the loop once its tool turn ran
        "response_records": sum(
            1
            for o in objects
            if type(o) is tuple
            and len(o) == 3
            and isinstance(o[0], Message)
            and isinstance(o[2], frozenset)
        ),
        # the drive's start rows are committed: not kept while the run is driven
        "start_rows": sum(1 for o in objects if isinstance(o, SnapshotRecord | MessageRecord)),
        "notes": [o for o in objects if isinstance(o, TurnNotes) and o is not NO_NOTES],
        "spends": {id(o) for o in objects if isinstance(o, Spend)},
        # what a run keeps between its tool turns: the latest calls' ids marked fresh and
        # their committed results
        "fresh_calls": [set(o.fresh_calls) for o in objects if isinstance(o, AgentRun)],
        "committed_results": [id(o.committed_results) for o in objects if isinstance(o, AgentRun)],
    }


async def test_a_model_call_in_flight_holds_no_wrapper_or_record_of_its_own(
    tmp_path: Path,
) -> None:
    seen: list[dict[str, object]] = []

    async def respond(request: ModelRequest) -> list[Block]:
        seen.append(_held_by_the_loop())
        if len(seen) < TURNS:
            return [call("note", text=f"step {len(seen)}")]
        return [TextBlock(text="done")]

    agent = Agent(name="worker", model="test-model", instructions="Work.", tools=[note])
    async with Runtime(db=tmp_path / "r.db", model=FunctionModel(respond)) as rt:
        result = await rt.run(agent, "go")
    assert result.status == "done" and result.output == "done"
    assert len(seen) == TURNS
    for held in seen:
        # the turn and its attempt: no coroutine per layer (call_model, retrying, the
        # attempt's row commit), no bound method of the run passed down as the attempt
        assert held["coroutines"] == ["ModelCalls.request_once", "ModelCalls.take_turn"], held
        assert held["run_methods"] == [], held
        assert held["helper_methods"] == [], held
        assert held["partials"] == 0
        assert held["ok_calls"] == 0  # the previous call is kept as values
        assert held["call_rows"] == 1, held
        assert held["span_holders"] == 0 and held["start_rows"] == 0, held
        assert held["response_records"] == 0, held
        assert held["notes"] == []  # a tool turn without notes carries the shared value
    # the spend ledger is updated in place: the same records at every call
    assert all(held["spends"] == seen[0]["spends"] for held in seen)
    # the tool turn before a call keeps no set of its ids (once its calls ran, nothing
    # asks which of them were fresh), and its results go into the run's one dict
    assert all(held["fresh_calls"] == [set()] for held in seen), seen
    assert all(held["committed_results"] == seen[0]["committed_results"] for held in seen)


async def test_a_call_sends_the_runs_own_tuples_in_a_request_equal_to_the_validated_one(
    tmp_path: Path,
) -> None:
    requests: list[ModelRequest] = []

    async def respond(request: ModelRequest) -> list[Block]:
        requests.append(request)
        run = _the_run()
        # the snapshot's blocks as the run keeps them: no validated copy of each tuple
        assert request.system is run.system and request.tools is run.tools
        if len(requests) < 3:
            return [call("note", text=f"step {len(requests)}")]
        return [TextBlock(text="done")]

    agent = Agent(name="worker", model="test-model", instructions="Work.", tools=[note])
    async with Runtime(db=tmp_path / "r.db", model=FunctionModel(respond)) as rt:
        result = await rt.run(agent, "go")
    assert result.status == "done" and len(requests) == 3
    for request in requests:
        validated = ModelRequest.model_validate(dict(request))
        assert validated == request
        assert validated.model_dump_json() == request.model_dump_json()
        assert validated.fingerprint() == request.fingerprint()
        assert validated.model_fields_set == request.model_fields_set
        assert request.messages[-1].role == "user" and request.message_breakpoints


class _OwnPipeline:
    """A pipeline that does not say whether it works ahead (no ``works_ahead``)."""

    def __init__(self) -> None:
        self.inner = PassThroughPipeline()
        self.background_seen: list[bool] = []

    async def ingest(self, run: ContextView, call: object, outcome: object) -> object:
        return await self.inner.ingest(run, call, outcome)  # type: ignore[arg-type]

    async def before_call(self, run: ContextView) -> ContextChange | None:
        self.background_seen.append(run.background is not None)
        return None

    async def on_prompt_too_long(self, run: ContextView, error: object, attempt: int) -> None:
        return None


def _the_run() -> AgentRun:
    (run,) = [o for o in gc.get_objects() if isinstance(o, AgentRun)]
    return run


@pytest.mark.parametrize(
    ("ahead_at", "has_group"), [(None, False), (0.4, True)], ids=["no-work-ahead", "ahead"]
)
async def test_a_run_gets_a_background_task_group_only_if_its_pipeline_may_use_one(
    tmp_path: Path, ahead_at: float | None, has_group: bool
) -> None:
    groups: list[bool] = []

    async def respond(request: ModelRequest) -> list[Block]:
        groups.append(_the_run().background is not None)
        return [TextBlock(text="done")] if groups[1:] else [call("note", text="x")]

    policy = ContextPolicy(window=200_000, compact_ahead_at=ahead_at)
    agent = Agent(name="w", model="test-model", instructions="Work.", tools=[note], context=policy)
    async with Runtime(db=tmp_path / "r.db", model=FunctionModel(respond)) as rt:
        result = await rt.run(agent, "go")  # the default pipeline (compaction)
    assert result.status == "done"
    assert groups == [has_group, has_group]


async def test_a_pipeline_that_does_not_say_gets_a_background_task_group(tmp_path: Path) -> None:
    pipeline = _OwnPipeline()
    agent = Agent(name="w", model="test-model", instructions="Work.", tools=[note])
    model = FunctionModel(lambda request: "done")
    async with Runtime(db=tmp_path / "r.db", model=model, pipeline=pipeline) as rt:  # type: ignore[arg-type]
        result = await rt.run(agent, "go")
    assert result.status == "done"
    assert pipeline.background_seen == [True]


def test_the_loops_waiting_coroutines_make_no_cells() -> None:
    # a name a nested function or (before Python 3.12) a comprehension reads is a cell,
    # made at each call: in a coroutine that waits (for the model, a tool, a commit) it
    # lives as long as that wait
    waiting = [
        AgentRun.drive,
        AgentRun._loop,
        ModelCalls.take_turn,
        ModelCalls.request_once,
        ModelCalls._commit_response,
        ToolCalls.run_tools,
        ToolCalls._run_one,
        ToolCalls._run_tool,
    ]
    assert {f.__qualname__: f.__code__.co_cellvars for f in waiting if f.__code__.co_cellvars} == {}


async def test_a_running_tool_holds_no_span_object_of_its_own(tmp_path: Path) -> None:
    # a tool may wait long (``spawn_agent`` waits for a whole sub-agent run): its span is
    # held as the span and its token, not a ``CurrentSpan`` and a bound ``__exit__``
    seen: list[int] = []

    @tool
    async def probe() -> str:
        """Look at what is alive."""
        gc.collect()
        seen.append(sum(1 for o in gc.get_objects() if isinstance(o, CurrentSpan)))
        return "looked"

    async def respond(request: ModelRequest) -> list[Block]:
        return [TextBlock(text="done")] if seen else [call("probe")]

    agent = Agent(name="worker", model="test-model", instructions="Work.", tools=[probe])
    async with Runtime(db=tmp_path / "r.db", model=FunctionModel(respond)) as rt:
        result = await rt.run(agent, "go")
    assert result.status == "done" and seen == [0]
