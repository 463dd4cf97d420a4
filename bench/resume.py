"""Benchmark 3: resuming a long, compacted session versus a short one.

Two interrupted sessions are built directly in a store (their last message is a tool result
waiting for the model): a long one with ~10,000 messages and 20 compaction boundaries (the
last one keeps ~100 messages), and a short one with ~100 messages and no boundary. Each has
the call rows, call outcomes and tool events a real run leaves behind.

Measured, in a fresh ``Runtime`` each time:
- ``open``: opening the store (schema check, ``PRAGMA quick_check``);
- ``load``: ``AgentRun.load`` (snapshot, latest boundary, messages after it, call count);
- ``to_first_request``: ``Runtime.resume`` up to the moment the model receives the request;
- ``resume_total``: ``Runtime.resume`` until it returns (one instant model call, the
  run's end, the session's usage summed over all its calls).
"""

from __future__ import annotations

import gc
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from anabranch import Agent, ContextPolicy, Message, ModelRequest, ModelResponse, Runtime, Usage
from anabranch.messages import TextBlock, ToolResultBlock, ToolUseBlock, canonical_json
from anabranch.runtime._loop import AgentRun
from anabranch.store import BoundaryRecord, RunRecord, SessionRecord, SQLiteStore
from anabranch.store.sqlite._index import index_new_rows
from bench.common import db_bytes, fresh_path, stats, text, turn_payload
from bench.ours import lookup

KEEP_RECENT = 6


def _agent() -> Agent:
    return Agent(
        name="resumer",
        model="bench-model",
        instructions="Answer questions.",
        tools=[lookup],
        max_turns=1_000_000,
        context=ContextPolicy(window=1_000_000_000, output_reserve=4_096),
    )


def _turn_messages(index: int) -> list[Message]:
    turn = turn_payload(index)
    call_id = f"toolu_{index}"
    return [
        Message.user(turn.user),
        Message(
            role="assistant",
            content=(ToolUseBlock(id=call_id, name="lookup", input={"query": turn.query}),),
        ),
        Message(role="user", content=(ToolResultBlock(tool_use_id=call_id, content=turn.result),)),
        Message(role="assistant", content=(TextBlock(text=turn.reply),)),
    ]


async def build_session(path: Path, messages: int, compactions: int) -> tuple[str, int]:
    """Write an interrupted session of about ``messages`` messages; returns (session, count)."""
    agent = _agent()
    store = await SQLiteStore.open(path, synchronous="OFF")
    session_id, run_id = "ses_bench", "run_bench"
    await store.create_session(
        SessionRecord(
            id=session_id,
            created=time.time(),
            kind="agent",
            entry=agent.name,
            task=turn_payload(0).user,
        )
    )
    await store.close()
    async with Runtime(path, model=_InstantModel(), synchronous="OFF") as rt:
        env = rt.environment(session_id)
        await AgentRun.start(env, agent, turn_payload(0).user, run_id=run_id)
    history: list[Message] = []
    index = 0
    while len(history) < messages + 1:
        history += _turn_messages(index)
        index += 1
    history = (
        history[: messages - 1]
        if history[messages - 1].role == "assistant" and not history[messages - 1].tool_uses
        else history[:messages]
    )
    while history[-1].role != "user" or not history[-1].tool_results:
        history.pop()
    conn = sqlite3.connect(path)
    conn.execute("BEGIN")
    now = time.time()
    rows = [
        (run_id, seq, m.role, canonical_json(m.model_dump(mode="json")["content"]), "message", now)
        for seq, m in enumerate(history)
        if seq > 0
    ]
    conn.executemany(
        "INSERT INTO messages (run_id, seq, role, content, kind, created) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        rows,
    )
    usage = canonical_json(Usage(input_tokens=1000, output_tokens=100).model_dump(mode="json"))
    turn = 0
    for seq, message in enumerate(history):
        if message.role != "assistant":
            continue
        turn += 1
        cursor = conn.execute(
            "INSERT INTO calls (run_id, turn, attempt, fingerprint, message_count, created) "
            "VALUES (?, ?, 1, ?, ?, ?)",
            (run_id, turn, "f" * 64, seq, now),
        )
        conn.execute(
            "INSERT INTO call_outcomes (call_id, status, response_id, model, stop_reason, usage, "
            "message_seq, created) VALUES (?, 'ok', ?, 'bench-model', ?, ?, ?, ?)",
            (
                cursor.lastrowid,
                f"msg_{turn}",
                "tool_use" if message.tool_uses else "end_turn",
                usage,
                seq,
                now,
            ),
        )
        for use in message.tool_uses:
            conn.execute(
                "INSERT INTO tool_events (run_id, call_id, name, event, is_error, "
                "created) VALUES (?, ?, 'lookup', 'started', 0, ?)",
                (run_id, use.id, now),
            )
            conn.execute(
                "INSERT INTO tool_events (run_id, call_id, name, event, is_error, "
                "created) VALUES (?, ?, 'lookup', 'finished', 0, ?)",
                (run_id, use.id, now),
            )
    index_new_rows(conn)  # as the store does before each commit (history search)
    conn.execute("COMMIT")
    conn.close()
    if compactions:
        store = await SQLiteStore.open(path, synchronous="OFF")
        step = len(history) // (compactions + 1)
        for k in range(1, compactions + 1):
            cut = len(history) - 100 if k == compactions else k * step
            while history[cut].role != "user" or history[cut].tool_results:
                cut -= 1  # the kept tail starts with a plain user turn
            summary = Message.user(
                f"<summary>compaction {k}: " + text(f"summary{k}", 2_000) + "</summary>"
            )
            await store.add_boundary(
                BoundaryRecord(
                    run_id=run_id,
                    kind="compaction",
                    prefix=json.dumps([summary.model_dump(mode="json")]),
                    ranges=json.dumps([[cut, None]]),
                    created=time.time(),
                    strategy="summarize",
                    trigger="auto",
                    tokens_before=0,
                    tokens_after=0,
                    messages_before=cut,
                    messages_after=len(history) - cut,
                )
            )
        await store.close()
    return session_id, len(history)


class _InstantModel:
    def __init__(self) -> None:
        self.first_request_at: float | None = None
        self.context_messages = 0

    async def request(self, request: ModelRequest) -> ModelResponse:
        if self.first_request_at is None:
            self.first_request_at = time.perf_counter()
            self.context_messages = len(request.messages)
        return ModelResponse(
            id="msg_resume",
            model=request.model,
            content=(TextBlock(text="resumed answer"),),
            usage=Usage(input_tokens=10, output_tokens=5),
        )


async def measure(path: Path, session_id: str) -> dict[str, float]:
    """One resume of a copy of the built session (resuming finishes it)."""
    work = path.with_name(path.stem + "_work.db")
    fresh_path(work.parent, work.name)
    source = sqlite3.connect(path)
    target = sqlite3.connect(work)
    source.backup(target)
    source.close()
    target.close()
    agent = _agent()
    gc.collect()
    model = _InstantModel()
    t0 = time.perf_counter()
    rt = Runtime(work, model=model, agents=[agent])
    await rt.open(create=False)
    opened = time.perf_counter()
    record = await rt.store.get_run("run_bench")
    assert isinstance(record, RunRecord)
    t1 = time.perf_counter()
    run = await AgentRun.load(rt.environment(session_id), agent, record)
    load = time.perf_counter() - t1
    context = len(run.context)
    t2 = time.perf_counter()
    result = await rt.resume(session_id, agent)
    total = time.perf_counter() - t2
    await rt.aclose()
    assert result.output == "resumed answer" and model.first_request_at is not None
    return {
        "open_s": opened - t0,
        "load_s": load,
        "to_first_request_s": model.first_request_at - t2,
        "resume_total_s": total,
        "context_messages": context,
        "request_messages": model.context_messages,
    }


async def benchmark(
    folder: Path,
    reps: int,
    *,
    long_messages: int = 10_000,
    compactions: int = 20,
    short_messages: int = 100,
    log: Any = print,
) -> dict[str, Any]:
    cases = {"long": (long_messages, compactions), "short": (short_messages, 0)}
    built: dict[str, tuple[Path, str, int]] = {}
    for name, (messages, boundaries) in cases.items():
        path = fresh_path(folder, f"resume_{name}.db")
        session_id, count = await build_session(path, messages, boundaries)
        built[name] = (path, session_id, count)
    trials: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
    for rep in range(reps):
        for name, (path, session_id, _) in built.items():
            figures = await measure(path, session_id)
            trials[name].append(figures)
            log(
                f"  resume {name} rep={rep + 1}: open {figures['open_s'] * 1e3:.1f} ms, "
                f"load {figures['load_s'] * 1e3:.1f} ms, first request "
                f"{figures['to_first_request_s'] * 1e3:.1f} ms, total "
                f"{figures['resume_total_s'] * 1e3:.1f} ms "
                f"({figures['context_messages']} messages in context)"
            )
    out: dict[str, Any] = {"cases": {}}
    for name, (path, _, count) in built.items():
        runs = trials[name]
        out["cases"][name] = {
            "messages": count,
            "compactions": cases[name][1],
            "db_bytes": db_bytes(path),
            "context_messages": runs[-1]["context_messages"],
            **{
                key: stats([r[key] for r in runs])
                for key in ("open_s", "load_s", "to_first_request_s", "resume_total_s")
            },
        }
    long, short = out["cases"]["long"], out["cases"]["short"]
    out["ratio_long_to_short"] = {
        key: long[key]["median"] / short[key]["median"]
        for key in ("open_s", "load_s", "to_first_request_s", "resume_total_s")
    }
    return out
