"""The session the crash test kills, and the tools whose side effects it counts.

Every tool call appends its side effect to a file at most once per ``ctx.call_id`` (as a
real tool would use the call id as an idempotency key), and first asks the store whether
a result for that call was already committed: if so, the runtime ran a finished tool
again, and the tool records a violation.

The kill switch for points inside a tool lives here too (``KILL``): the driver sets it.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from anabranch import Agent, ContextPolicy, Graph, Task, ToolContext, tool
from anabranch.messages import ModelRequest, ModelResponse
from anabranch.testing import TestModel

__all__ = [
    "AGENTS",
    "GRAPH",
    "KILL",
    "ROOT",
    "SIDE_EFFECT_TOOLS",
    "TASK",
    "Config",
    "ScenarioModel",
    "configure",
]

TASK = "Survey the three sources and write up what each one says."
PAYLOAD_CHARS = 420
"""Length of every tool result: enough that small windows compact after a few rounds."""


@dataclass
class Config:
    """What the tools in this process write to, and when they kill it."""

    effects: Path | None = None
    violations: Path | None = None
    db: Path | str | None = None
    kill_event: str | None = None
    kill_at: int = 0
    tool_calls: int = field(default=0)


KILL = Config()
_count_lock = threading.Lock()  # sync tools run in worker threads


def configure(
    *, effects: Path, violations: Path, db: Path | str, event: str | None, at: int
) -> None:
    KILL.effects, KILL.violations, KILL.db = effects, violations, db
    KILL.kill_event, KILL.kill_at, KILL.tool_calls = event, at, 0


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _finished_before(ctx: ToolContext) -> bool:
    assert KILL.db is not None
    if isinstance(KILL.db, str):  # a PostgreSQL DSN
        import psycopg

        with psycopg.connect(KILL.db) as pg:
            found = pg.execute(
                "SELECT 1 FROM anabranch.tool_events WHERE run_id = %s AND call_id = %s "
                "AND event = 'finished'",
                (ctx.run_id, ctx.call_id),
            ).fetchone()
        return found is not None
    conn = sqlite3.connect(KILL.db, timeout=30)
    try:
        row = conn.execute(
            "SELECT 1 FROM tool_events WHERE run_id = ? AND call_id = ? AND event = 'finished'",
            (ctx.run_id, ctx.call_id),
        ).fetchone()
    finally:
        conn.close()
    return row is not None


def _append(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as file:
        file.write(line + "\n")
        file.flush()
        os.fsync(file.fileno())


def _side_effect(name: str, key: str, ctx: ToolContext) -> str:
    """The body of every test tool: probe, maybe die, effect once per call id, maybe die."""
    assert KILL.effects is not None and KILL.violations is not None
    if _finished_before(ctx):
        _append(KILL.violations, f"{ctx.call_id}\t{name} ran again after its result was committed")
    with _count_lock:
        KILL.tool_calls += 1
        number = KILL.tool_calls
    if KILL.kill_event == "tool" and number == KILL.kill_at:
        _die()
    done = KILL.effects.read_text().splitlines() if KILL.effects.exists() else []
    if not any(line.split("\t", 1)[0] == ctx.call_id for line in done):
        _append(KILL.effects, f"{ctx.call_id}\t{ctx.agent_name}\t{name}:{key}")
    if KILL.kill_event == "tool_after" and number == KILL.kill_at:
        _die()
    body = f"{name} {key} by {ctx.agent_name}: "
    return (body + f"finding about {key} " * 40)[:PAYLOAD_CHARS]


@tool
async def read_source(
    source: Annotated[Literal["alpha", "beta", "gamma"], Field(description="Which source")],
    ctx: ToolContext,
) -> str:
    """Read one source and return its notes."""
    return _side_effect("read_source", source, ctx)


@tool
def file_note(
    note: Annotated[str, Field(description="The note to file")],
    ctx: ToolContext,
) -> str:
    """File a note in the shared notebook (a side effect)."""
    return _side_effect("file_note", note, ctx)


def _policy(window: int) -> ContextPolicy:
    return ContextPolicy(
        window=window, compact_at=0.6, output_reserve=300, keep_recent=2, strategy="summarize"
    )


checker = Agent(
    name="checker",
    model="crash-checker",
    description="Checks every source once more.",
    instructions="Check every source, then report.",
    tools=[read_source],
    context=_policy(1_800),
    max_tokens=300,
    max_turns=12,
)
researcher = Agent(
    name="researcher",
    model="crash-researcher",
    description="Reads every source and files a note on each.",
    instructions="Read every source, file a note on each, then report.",
    tools=[read_source, file_note],
    context=_policy(2_000),
    max_tokens=300,
    max_turns=12,
)
auditor = Agent(
    name="auditor",
    model="crash-auditor",
    description="Files an audit note and has a checker verify the sources.",
    instructions="File an audit note, delegate the check, then report.",
    tools=[file_note],
    subagents=[checker],
    context=_policy(4_000),
    max_tokens=300,
    max_turns=12,
)
supervisor = Agent(
    name="supervisor",
    model="crash-supervisor",
    instructions="Delegate the research and the audit in parallel, then write the answer.",
    subagents=[researcher, auditor],
    context=_policy(8_000),
    max_tokens=300,
    max_turns=12,
)

writer = Agent(
    name="writer",
    model="crash-writer",
    description="Writes the final answer from the reports.",
    instructions="File the final note, then write the answer from the reports.",
    tools=[file_note],
    context=_policy(4_000),
    max_tokens=300,
    max_turns=12,
)

ROUNDS = {
    supervisor.model: 1,  # one turn spawning researcher and auditor in parallel
    researcher.model: 3,  # three rounds of tools: compacts in its small window
    auditor.model: 1,  # a note and a checker (depth 2), in parallel
    checker.model: 2,
    writer.model: 1,
}
"""Tool-calling rounds of the test model, per agent (the request's model names the agent)."""

ROOT = supervisor
AGENTS = (supervisor,)
GRAPH = Graph(
    name="survey",
    tasks=[
        Task(id="read", agent=researcher, prompt="Read the sources."),
        Task(id="check", agent=checker, prompt="Check the sources."),
        Task(id="audit", agent=auditor, prompt="Audit the reading.", depends_on=["read"]),
        Task(id="write", agent=writer, prompt="Write it up.", depends_on=["audit", "check"]),
    ],
    max_concurrency=2,
)
"""The graph variant: two tasks in parallel, an auditor that spawns, a final writer."""
SIDE_EFFECT_TOOLS = frozenset({"read_source", "file_note"})


class ScenarioModel:
    """The deterministic model behind the server: ``TestModel`` with each agent's rounds."""

    def __init__(self) -> None:
        self.models = {name: TestModel(rounds=rounds) for name, rounds in ROUNDS.items()}

    async def request(self, request: ModelRequest) -> ModelResponse:
        return await self.models[request.model].request(request)
