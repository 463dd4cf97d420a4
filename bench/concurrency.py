"""Benchmark 2: many concurrent agent runs in one process on one SQLite file.

Each run makes 10 model calls (9 rounds of one tool call, then the answer) against a
model that answers after ``latency`` seconds; the tool answers at once. With unlimited
parallelism a run takes 10 x latency, so that is the ideal wall time for any number of
runs. Measured: wall time / ideal, process CPU seconds per model call, lock errors, and
whether every transcript is complete in the store.

Mix ``supervisor``: each session is a supervisor that spawns two workers in parallel with
``spawn_agent`` on its first call, waits for their reports, then does 8 more rounds and
answers: every agent run (supervisor or worker) makes 10 model calls, and a session's ideal
wall time is 0.2 s + 2 s (the workers) + 1.8 s = 20 x latency. Mix ``root``: independent
root agents, ideal 10 x latency.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

import anyio

from anabranch import Agent, ContextPolicy, ModelRequest, ModelResponse, Runtime, Usage, tool
from anabranch.messages import TextBlock, ToolUseBlock
from bench.common import fresh_path, noop_tracer_provider, stats

CALLS_PER_RUN = 10


@tool
async def note(text: str) -> str:
    """Record a note; returns a short acknowledgement."""
    return f"noted: {text}"


SUPERVISOR_MODEL = "bench-supervisor"
CHILDREN = 2


def _response(step: int, *, supervisor: bool = False) -> ModelResponse:
    content: tuple[Any, ...]
    if supervisor and step == 0:
        content = tuple(
            ToolUseBlock(
                id=f"toolu_spawn_{i}",
                name="spawn_agent",
                input={"agent": "worker", "task": f"part {i}: work through the steps"},
            )
            for i in range(CHILDREN)
        )
        stop = "tool_use"
    elif step < CALLS_PER_RUN - 1:
        content = (
            ToolUseBlock(
                id=f"toolu_{step}", name="note", input={"text": f"step {step} " + "x" * 80}
            ),
        )
        stop = "tool_use"
    else:
        content = (TextBlock(text="All steps done. " + "y" * 200),)
        stop = "end_turn"
    return ModelResponse(
        id=f"msg_{step}",
        model="bench-model",
        content=content,
        stop_reason=stop,
        usage=Usage(input_tokens=500, output_tokens=50),
    )


def _responses(supervisor: bool) -> list[ModelResponse]:
    return [_response(step, supervisor=supervisor) for step in range(CALLS_PER_RUN)]


class LatencyModel:
    """Answers after ``latency`` seconds: 9 tool calls, then a final answer.

    The responses are built once, so the model's own CPU is ~0 and the CPU measured is the
    runtime's (a real client parses a response per call; that cost is the model's).
    """

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.calls = 0
        self.responses = _responses(False)
        self.supervisor = _responses(True)

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        await anyio.sleep(self.latency)
        step = min((len(request.messages) - 1) // 2, CALLS_PER_RUN - 1)
        if request.model == SUPERVISOR_MODEL:
            return self.supervisor[step]
        return self.responses[step]


def worker_agent() -> Agent:
    return Agent(
        name="worker",
        model="bench-model",
        instructions="Work through the steps.",
        description="Works through the steps of one part.",
        tools=[note],
        max_turns=CALLS_PER_RUN + 5,
        context=ContextPolicy(window=200_000),
    )


def supervisor_agent() -> Agent:
    return Agent(
        name="supervisor",
        model=SUPERVISOR_MODEL,
        instructions="Split the work, delegate, then finish the steps.",
        tools=[note],
        subagents=[worker_agent()],
        max_turns=CALLS_PER_RUN + 5,
        context=ContextPolicy(window=200_000),
    )


class GCTime:
    """CPU seconds the cyclic garbage collector spends (a ``gc.callbacks`` entry; a
    collection runs on the thread that triggered it): part of the process CPU measured,
    paid for every object anything allocates."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._started
            self.collections[info["generation"]] += 1


def _is_lock_error(error: BaseException) -> bool:
    return "locked" in str(error).lower() or "busy" in str(error).lower()


async def trial(
    folder: Path,
    runs: int,
    latency: float,
    synchronous: str = "FULL",
    tracing: bool = True,
    mix: str = "supervisor",
) -> dict[str, Any]:
    """One trial: about ``runs`` concurrent agent runs; returns its figures and checks."""
    from opentelemetry.trace import NoOpTracerProvider

    path = fresh_path(folder, f"concurrency_{runs}.db")
    provider, exporter = noop_tracer_provider()
    tracer_provider: Any = provider if tracing else NoOpTracerProvider()
    model = LatencyModel(latency)
    if mix == "supervisor":
        agent, per_session = supervisor_agent(), 1 + CHILDREN
    else:
        agent, per_session = worker_agent(), 1
    sessions = -(-runs // per_session)
    errors: list[BaseException] = []
    session_ids: list[str] = []

    async with Runtime(
        path, model=model, tracer_provider=tracer_provider, synchronous=synchronous
    ) as rt:  # type: ignore[arg-type]

        async def one(index: int) -> None:
            try:
                result = await rt.run(agent, f"task {index}: work through the steps")
                session_ids.append(result.session_id)
            except Exception as error:  # counted, never hidden
                errors.append(error)

        gc.collect()
        collector = GCTime()
        gc.callbacks.append(collector)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        try:
            async with anyio.create_task_group() as group:
                for index in range(sessions):
                    group.start_soon(one, index)
        finally:
            gc.callbacks.remove(collector)
        wall = time.perf_counter() - wall0
        cpu = time.process_time() - cpu0
        check = await _check(rt, sessions, sessions * per_session)
    provider.shutdown()
    ideal = CALLS_PER_RUN * latency * (2 if mix == "supervisor" else 1)
    return {
        "runs": sessions * per_session,
        "sessions": sessions,
        "mix": mix,
        "wall_s": wall,
        "ideal_s": ideal,
        "wall_over_ideal": wall / ideal,
        "cpu_s": cpu,
        "model_calls": model.calls,
        "cpu_ms_per_model_call": cpu / max(model.calls, 1) * 1e3,
        "gc_ms_per_model_call": collector.seconds / max(model.calls, 1) * 1e3,
        "gc_collections": collector.collections,
        "errors": len(errors),
        "lock_errors": sum(1 for e in errors if _is_lock_error(e)),
        "error_samples": sorted({f"{type(e).__name__}: {e}"[:200] for e in errors})[:5],
        "spans": exporter.spans,
        **check,
    }


async def _check(rt: Runtime, expected_sessions: int, runs: int) -> dict[str, Any]:
    """Every session done; every run with 10 ok calls and a complete transcript."""
    store = rt.store
    sessions = await store.list_sessions(limit=expected_sessions + 10)
    done = sum(1 for s in sessions if s.status == "done")
    rows = await store.query(
        "SELECT r.id AS run_id, "
        "(SELECT COUNT(*) FROM messages m WHERE m.run_id = r.id) AS messages, "
        "(SELECT COUNT(*) FROM calls c JOIN call_outcomes o ON o.call_id = c.id "
        " WHERE c.run_id = r.id AND o.status = 'ok') AS ok_calls, "
        "(SELECT status FROM run_ends e WHERE e.run_id = r.id) AS status "
        "FROM runs r"
    )
    expected_messages = 1 + 2 * (CALLS_PER_RUN - 1) + 1
    complete = sum(
        1
        for r in rows
        if r["messages"] == expected_messages
        and r["ok_calls"] == CALLS_PER_RUN
        and r["status"] == "done"
    )
    return {
        "sessions_done": done,
        "transcripts_complete": complete,
        "all_complete": complete == runs and done == expected_sessions and len(rows) == runs,
    }


MIXES = {
    "supervisor": f"sessions of a supervisor spawning {CHILDREN} workers (spawn_agent); "
    "ideal = 20 x latency",
    "root": "independent root agents; ideal = 10 x latency",
}


async def benchmark(
    folder: Path,
    counts: list[int],
    reps: int,
    latency: float = 0.2,
    mix: str = "supervisor",
    log: Any = print,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "latency_s": latency,
        "calls_per_run": CALLS_PER_RUN,
        "mix": MIXES[mix],
        "counts": {},
    }
    for runs in counts:
        trials = []
        for rep in range(reps):
            result = await trial(folder, runs, latency, mix=mix)
            trials.append(result)
            log(
                f"  concurrency runs={result['runs']} ({mix}) rep={rep + 1}: "
                f"wall {result['wall_s']:.2f} s "
                f"({result['wall_over_ideal']:.2f}x ideal), "
                f"{result['cpu_ms_per_model_call']:.2f} ms CPU/call "
                f"(of which GC {result['gc_ms_per_model_call']:.2f}), "
                f"errors {result['errors']} (lock {result['lock_errors']}), "
                f"complete {result['transcripts_complete']}/{result['runs']}"
            )
        out["counts"][str(runs)] = {
            "wall_s": stats([t["wall_s"] for t in trials]),
            "wall_over_ideal": stats([t["wall_over_ideal"] for t in trials]),
            "cpu_ms_per_model_call": stats([t["cpu_ms_per_model_call"] for t in trials]),
            "gc_ms_per_model_call": stats([t["gc_ms_per_model_call"] for t in trials]),
            "lock_errors": sum(t["lock_errors"] for t in trials),
            "errors": sum(t["errors"] for t in trials),
            "error_samples": trials[-1]["error_samples"],
            "all_complete": all(t["all_complete"] for t in trials),
            "transcripts_complete": [t["transcripts_complete"] for t in trials],
            "ideal_s": trials[-1]["ideal_s"],
            "agent_runs": trials[-1]["runs"],
            "sessions": trials[-1]["sessions"],
        }
    return out
