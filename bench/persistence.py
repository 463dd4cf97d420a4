"""Benchmark 1: persistence overhead per conversational turn, against history length.

Every contender holds the same conversation of ``n`` turns. A turn is a user message
(200 chars), an assistant tool call (150 chars of arguments), the tool's result (2,000
chars) and the assistant's reply (400 chars). Models are instant and local.

Contenders:
- ``floor``: a plain ``sqlite3`` append-only table, one transaction per turn (4 rows).
- ``anabranch``: the real loop (``AgentRun``) with the write-ahead protocol, the default
  context pipeline, token accounting and tracing through an SDK tracer with a dropping
  exporter.
- ``langgraph``: a ``StateGraph`` over ``MessagesState`` (agent node + ``ToolNode``) with
  ``AsyncSqliteSaver``, its default per-step checkpointing, ``ainvoke`` per turn.
- ``openai-agents``: ``Runner.run`` per turn with a local ``Model`` and ``SQLiteSession``
  (its tracing on, with a processor that drops spans).
- ``openai-session``: ``SQLiteSession.add_items`` per turn only (the storage layer alone).
"""

from __future__ import annotations

import gc
import json
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    Turn,
    db_bytes,
    fresh_path,
    noop_tracer_provider,
    ratio,
    stats,
    tool_result_for,
    turn_payload,
)


@dataclass
class Trial:
    """One contender, one history length, one repetition."""

    per_turn: list[float]
    total: float
    bytes: int
    load: float
    loaded_messages: int
    extra: dict[str, Any] = field(default_factory=dict)

    def tail_mean(self) -> float:
        """Mean per-turn time over the last 10% of turns."""
        tail = self.per_turn[-max(1, len(self.per_turn) // 10) :]
        return sum(tail) / len(tail)


Runner = Callable[[Path, int, str], Awaitable[Trial]]


# --------------------------------------------------------------------------- floor
def _floor_messages(turn: Turn, index: int) -> list[tuple[str, str]]:
    call_id = f"call_{index}"
    return [
        ("user", json.dumps([{"type": "text", "text": turn.user}])),
        (
            "assistant",
            json.dumps(
                [
                    {
                        "type": "tool_use",
                        "id": call_id,
                        "name": "lookup",
                        "input": {"query": turn.query},
                    }
                ]
            ),
        ),
        (
            "user",
            json.dumps(
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": call_id,
                        "content": tool_result_for(turn.query),
                    }
                ]
            ),
        ),
        ("assistant", json.dumps([{"type": "text", "text": turn.reply}])),
    ]


async def run_floor(folder: Path, n: int, synchronous: str) -> Trial:
    path = fresh_path(folder, "floor.db")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute(
        "CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation TEXT, seq INTEGER, "
        "role TEXT, content TEXT)"
    )
    conn.execute("CREATE INDEX messages_conv ON messages (conversation, seq)")
    per_turn: list[float] = []
    started = time.perf_counter()
    seq = 0
    for index in range(n):
        t0 = time.perf_counter()
        rows = _floor_messages(turn_payload(index), index)
        conn.execute("BEGIN IMMEDIATE")
        for role, content in rows:
            conn.execute(
                "INSERT INTO messages (conversation, seq, role, content) VALUES (?, ?, ?, ?)",
                ("c1", seq, role, content),
            )
            seq += 1
        conn.execute("COMMIT")
        per_turn.append(time.perf_counter() - t0)
    total = time.perf_counter() - started
    conn.close()
    size = db_bytes(path)
    gc.collect()  # a collection of earlier garbage is not the load's cost
    t0 = time.perf_counter()
    conn = sqlite3.connect(path)
    loaded = [
        (role, json.loads(content))
        for role, content in conn.execute(
            "SELECT role, content FROM messages WHERE conversation = ? ORDER BY seq", ("c1",)
        )
    ]
    load = time.perf_counter() - t0
    conn.close()
    return Trial(per_turn, total, size, load, len(loaded))


# --------------------------------------------------------------------------- anabranch
async def run_anabranch(folder: Path, n: int, synchronous: str) -> Trial:
    from anabranch.runtime._loop import AgentRun
    from anabranch.runtime._runtime import Runtime
    from anabranch.store import RunRecord
    from bench.ours import ScriptedModel, bench_agent, chat_turn, new_session

    path = fresh_path(folder, "anabranch.db")
    provider, exporter = noop_tracer_provider()
    agent = bench_agent()

    def script(index: int) -> tuple[str, str]:
        turn = turn_payload(index)
        return turn.query, turn.reply

    model = ScriptedModel(script)
    per_turn: list[float] = []
    async with Runtime(path, model=model, tracer_provider=provider, synchronous=synchronous) as rt:  # type: ignore[arg-type]
        started = time.perf_counter()
        t0 = started
        env = await new_session(rt, agent, turn_payload(0).user)
        run = await AgentRun.start(env, agent, turn_payload(0).user)
        await run.drive()
        per_turn.append(time.perf_counter() - t0)
        for index in range(1, n):
            t0 = time.perf_counter()
            await chat_turn(run, turn_payload(index).user)
            per_turn.append(time.perf_counter() - t0)
        total = time.perf_counter() - started
        run_id = run.id
        session_id = env.session_id
        assert len(run.context) == 4 * n, (len(run.context), n)
    size = db_bytes(path)
    tables = table_bytes(path)
    async with Runtime(path, model=model, tracer_provider=provider) as rt:
        record = await rt.store.get_run(run_id)
        assert isinstance(record, RunRecord)
        gc.collect()  # a collection of earlier garbage is not the load's cost
        t0 = time.perf_counter()
        loaded = await AgentRun.load(rt.environment(session_id), agent, record)
        load = time.perf_counter() - t0
    provider.shutdown()
    return Trial(
        per_turn,
        total,
        size,
        load,
        len(loaded.context),
        {"spans": exporter.spans, "model_calls": model.calls, "table_bytes": tables},
    )


def table_bytes(path: Path) -> dict[str, int]:
    """Bytes per table and index (SQLite's dbstat), largest first; {} where unavailable."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC"
        ).fetchall()
    except sqlite3.Error:
        rows = []
    finally:
        conn.close()
    return {str(name): int(size) for name, size in rows}


# --------------------------------------------------------------------------- langgraph
async def run_langgraph(folder: Path, n: int, synchronous: str) -> Trial:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool as lc_tool
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    @lc_tool
    def lookup(query: str) -> str:
        """Look something up; returns about 2,000 characters."""
        return tool_result_for(query)

    current = {"index": 0}

    async def agent_node(state: MessagesState) -> dict[str, Any]:
        turn = turn_payload(current["index"])
        if isinstance(state["messages"][-1], ToolMessage):
            return {"messages": [AIMessage(content=turn.reply)]}
        call = {"name": "lookup", "args": {"query": turn.query}, "id": f"call_{current['index']}"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    def build(saver: AsyncSqliteSaver) -> Any:
        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent_node)
        graph.add_node("tools", ToolNode([lookup]))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        return graph.compile(checkpointer=saver)

    path = fresh_path(folder, "langgraph.db")
    config = {"configurable": {"thread_id": "t1"}}
    per_turn: list[float] = []
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        app = build(saver)
        started = time.perf_counter()
        for index in range(n):
            current["index"] = index
            t0 = time.perf_counter()
            await app.ainvoke(
                {"messages": [HumanMessage(content=turn_payload(index).user)]}, config
            )
            per_turn.append(time.perf_counter() - t0)
        total = time.perf_counter() - started
        async with saver.conn.execute("SELECT COUNT(*) FROM checkpoints") as cursor:
            row = await cursor.fetchone()
        checkpoints = int(row[0]) if row else 0
    size = db_bytes(path)
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        app = build(saver)
        gc.collect()  # a collection of earlier garbage is not the load's cost
        t0 = time.perf_counter()
        state = await app.aget_state(config)
        load = time.perf_counter() - t0
        loaded = len(state.values["messages"])
    return Trial(per_turn, total, size, load, loaded, {"checkpoints": checkpoints})


# --------------------------------------------------------------------------- openai-agents
def _openai_fake_model(current: dict[str, int]) -> Any:
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    class LocalModel(Model):
        async def get_response(
            self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
        ) -> ModelResponse:
            index = current["index"]
            turn = turn_payload(index)
            last = input[-1] if isinstance(input, list) and input else {}
            if isinstance(last, dict) and last.get("type") == "function_call_output":
                output: list[Any] = [
                    ResponseOutputMessage(
                        id=f"msg_{index}",
                        role="assistant",
                        status="completed",
                        type="message",
                        content=[
                            ResponseOutputText(text=turn.reply, type="output_text", annotations=[])
                        ],
                    )
                ]
            else:
                output = [
                    ResponseFunctionToolCall(
                        id=f"fc_{index}",
                        call_id=f"call_{index}",
                        name="lookup",
                        arguments=json.dumps({"query": turn.query}),
                        type="function_call",
                        status="completed",
                    )
                ]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    return LocalModel()


def _drop_openai_traces() -> None:
    from agents.tracing import TracingProcessor, set_trace_processors

    class Drop(TracingProcessor):
        def on_trace_start(self, trace: Any) -> None: ...
        def on_trace_end(self, trace: Any) -> None: ...
        def on_span_start(self, span: Any) -> None: ...
        def on_span_end(self, span: Any) -> None: ...
        def shutdown(self) -> None: ...
        def force_flush(self) -> None: ...

    set_trace_processors([Drop()])


async def run_openai_agents(folder: Path, n: int, synchronous: str) -> Trial:
    from agents import Agent as OAAgent
    from agents import Runner as OARunner
    from agents import SQLiteSession, function_tool

    _drop_openai_traces()

    @function_tool
    def lookup(query: str) -> str:
        """Look something up; returns about 2,000 characters."""
        return tool_result_for(query)

    current = {"index": 0}
    agent = OAAgent(
        name="bench",
        instructions="You answer questions, using lookup first.",
        model=_openai_fake_model(current),
        tools=[lookup],
    )
    path = fresh_path(folder, "openai.db")
    session = SQLiteSession("s1", str(path))
    per_turn: list[float] = []
    started = time.perf_counter()
    for index in range(n):
        current["index"] = index
        t0 = time.perf_counter()
        await OARunner.run(agent, turn_payload(index).user, session=session)
        per_turn.append(time.perf_counter() - t0)
    return await _openai_trial(session, path, started, per_turn)


async def _openai_trial(session: Any, path: Path, started: float, per_turn: list[float]) -> Trial:
    """Close an OpenAI Agents ``SQLiteSession`` and time a full load from a fresh one."""
    from agents import SQLiteSession

    total = time.perf_counter() - started
    session.close()
    size = db_bytes(path)
    gc.collect()  # a collection of earlier garbage is not the load's cost
    t0 = time.perf_counter()
    fresh = SQLiteSession("s1", str(path))
    items = await fresh.get_items()
    load = time.perf_counter() - t0
    fresh.close()
    return Trial(per_turn, total, size, load, len(items))


async def run_openai_session(folder: Path, n: int, synchronous: str) -> Trial:
    from agents import SQLiteSession

    path = fresh_path(folder, "openai_session.db")
    session = SQLiteSession("s1", str(path))
    per_turn: list[float] = []
    started = time.perf_counter()
    for index in range(n):
        t0 = time.perf_counter()
        turn = turn_payload(index)
        call_id = f"call_{index}"
        await session.add_items(
            [
                {"role": "user", "content": turn.user},
                {
                    "type": "function_call",
                    "call_id": call_id,
                    "name": "lookup",
                    "arguments": json.dumps({"query": turn.query}),
                },
                {
                    "type": "function_call_output",
                    "call_id": call_id,
                    "output": tool_result_for(turn.query),
                },
                {"role": "assistant", "content": turn.reply},
            ]
        )  # type: ignore[list-item]
        per_turn.append(time.perf_counter() - t0)
    return await _openai_trial(session, path, started, per_turn)


CONTENDERS: dict[str, Runner] = {
    "floor": run_floor,
    "anabranch": run_anabranch,
    "langgraph": run_langgraph,
    "openai-agents": run_openai_agents,
    "openai-session": run_openai_session,
}


def available() -> dict[str, str | None]:
    """Contenders whose packages are missing, with the reason (None when present)."""
    out: dict[str, str | None] = {"floor": None, "anabranch": None}
    for name, module in (
        ("langgraph", "langgraph.checkpoint.sqlite.aio"),
        ("openai-agents", "agents"),
        ("openai-session", "agents"),
    ):
        try:
            __import__(module)
            out[name] = None
        except ImportError as exc:
            out[name] = f"not installed ({exc.name}); pip install -e '.[bench]'"
    return out


async def benchmark(
    folder: Path,
    sizes: list[int],
    reps: int,
    *,
    synchronous: str = "FULL",
    contenders: list[str] | None = None,
    max_n: dict[str, int] | None = None,
    reps_for: dict[int, int] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run every contender ``reps`` times at each size; figures and ratios to the floor."""
    names = contenders or list(CONTENDERS)
    missing = available()
    limits = max_n or {}
    results: dict[str, Any] = {
        "sizes": sizes,
        "reps": {n: (reps_for or {}).get(n, reps) for n in sizes},
        "synchronous": synchronous,
        "contenders": {},
        "skipped": {},
    }
    for name in names:
        if missing.get(name):
            results["skipped"][name] = missing[name]
    for n in sizes:
        trials: dict[str, list[Trial]] = {}
        for rep in range((reps_for or {}).get(n, reps)):
            for name in names:
                if name in results["skipped"]:
                    continue
                if n > limits.get(name, n):
                    results["skipped"].setdefault(
                        f"{name}@{n}", f"not run above N={limits[name]} (time budget)"
                    )
                    continue
                for index in range(n):  # payloads are built before any clock starts
                    tool_result_for(turn_payload(index).query)
                gc.collect()
                trial = await CONTENDERS[name](folder, n, synchronous)
                trials.setdefault(name, []).append(trial)
                log(
                    f"  persistence N={n} rep={rep + 1} {name}: "
                    f"tail {trial.tail_mean() * 1e3:.2f} ms/turn, total {trial.total:.2f} s, "
                    f"{trial.bytes / n:.0f} B/turn, load {trial.load * 1e3:.1f} ms"
                )
        figures: dict[str, Any] = {}
        for name, runs in trials.items():
            figures[name] = {
                "tail_per_turn_s": stats([t.tail_mean() for t in runs]),
                "mean_per_turn_s": stats([t.total / n for t in runs]),
                "total_s": stats([t.total for t in runs]),
                "bytes_per_turn": stats([t.bytes / n for t in runs]),
                "load_s": stats([t.load for t in runs]),
                "loaded_items": runs[-1].loaded_messages,
                "extra": runs[-1].extra,
            }
        if "floor" in figures:
            floor = figures["floor"]
            for fig in figures.values():
                fig["ratio_to_floor"] = {
                    key: ratio(fig[key], floor[key])
                    for key in ("tail_per_turn_s", "total_s", "bytes_per_turn", "load_s")
                }
        for name, fig in figures.items():
            results["contenders"].setdefault(name, {})[str(n)] = fig
    return results


def trial_dict(trial: Trial) -> dict[str, Any]:
    return asdict(trial)
