"""Benchmark (not a test): how much of a long multi-agent session's input comes from cache.

Runs one offline workload — a supervisor that works in steps and delegates to parallel
researcher sub-agents, about 200 agent turns with several compactions — against the local
Messages API server (prompt-cache semantics of the real API: prefix entries, 4 breakpoints,
20-block lookback, TTLs, minimum cacheable length) through the official SDK, three times:

- ``default``: anabranch's defaults (system-prompt snapshot, deterministic breakpoints);
- ``timestamp, no snapshot``: the snapshot off and a timestamp in the system prompt;
- ``no breakpoints``: no cache_control at all.

It prints the share of input tokens read from cache, cache writes, estimated cost and cache
breaks by cause for each. Sub-agents and compaction come from the runtime's defaults when
those features are present (``spawn_agent`` built-in, compacting pipeline); otherwise this
script installs small stand-ins so the workload stays the same, and says so.

    PYTHONPATH=src python bench/cache.py [--turns 200] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio

from anabranch import Agent, AnthropicModel, ContextPolicy, Runtime, tool
from anabranch.context._pricing import Cost, PriceTable
from anabranch.messages import (
    Block,
    Message,
    ModelRequest,
    ModelResponse,
    TextBlock,
    ToolDefinition,
    ToolUseBlock,
    Usage,
    messages_to_json,
)
from anabranch.runtime._builtins import BuiltinTool, ToolOutcome
from anabranch.runtime._context_view import BoundaryCommit, ContextChange, ContextView
from anabranch.runtime._loop import AgentRun
from anabranch.runtime._pipeline import ContextPipeline, PassThroughPipeline
from anabranch.runtime._runtime import default_builtins, default_pipeline
from anabranch.store import BoundaryRecord
from anabranch.testing import MessagesServer
from anabranch.testing._models import is_summary_request

MODEL = "claude-sonnet-5-5"
MIN_CACHE_TOKENS = 1024
GOAL = 0.90
STEP_RESULT_CHARS = 900
_STEP = re.compile(r"step (\d+) of (\d+) done")
_TASK = re.compile(r"Do (\d+) steps")


def prose(seed: str, chars: int) -> str:
    """Deterministic filler text of exactly ``chars`` characters."""
    words: list[str] = []
    counter = 0
    while sum(len(w) + 1 for w in words) < chars:
        digest = hashlib.sha256(f"{seed}:{counter}".encode()).hexdigest()
        words += [digest[i : i + 7] for i in range(0, 56, 7)]
        counter += 1
    return " ".join(words)[:chars]


SUPERVISOR_RULES = (
    "You lead a research effort. Work through your numbered steps with the step tool, and "
    "delegate independent sub-questions to researcher sub-agents in parallel.\n\n"
    + "\n".join(f"Rule {i}: {prose(f'sup{i}', 160)}" for i in range(30))
)
RESEARCHER_RULES = (
    "You research one sub-question. Work through your numbered steps with the step tool, "
    "then report briefly.\n\n" + "\n".join(f"Rule {i}: {prose(f'res{i}', 160)}" for i in range(30))
)


@tool
def step(n: int, total: int) -> str:
    """Carry out step n of a plan of `total` steps and return what it found."""
    return f"step {n} of {total} done\n" + prose(f"step{n}/{total}", STEP_RESULT_CHARS)


# ----------------------------------------------------------------------------- workload
@dataclass(frozen=True)
class Workload:
    """A supervisor with ``supervisor_steps`` steps that, at each of ``delegations`` points,
    spawns ``children`` researchers of ``child_steps`` steps each (in parallel)."""

    supervisor_steps: int
    delegations: int
    children: int
    child_steps: int

    @classmethod
    def for_turns(cls, turns: int) -> Workload:
        """About ``turns`` agent turns: roughly 30% supervisor, 70% researchers."""
        children, delegations = 2, 3
        child_steps = max(2, round(turns * 0.7 / (delegations * children)) - 1)
        supervisor = max(delegations + 1, turns - delegations * children * (child_steps + 1) - 1)
        return cls(supervisor, delegations, children, child_steps)

    @property
    def turns(self) -> int:
        return self.supervisor_steps + 1 + self.delegations * self.children * (self.child_steps + 1)

    def delegate_at(self) -> set[int]:
        gap = self.supervisor_steps // (self.delegations + 1)
        return {gap * (i + 1) for i in range(self.delegations)}


class WorkloadPolicy:
    """The model behind the server: follows the step counter in the latest tool result.

    Deterministic, and robust to compaction: the counter lives in the most recent tool
    result, which every compaction keeps.
    """

    def __init__(self, workload: Workload) -> None:
        self.workload = workload

    async def request(self, request: ModelRequest) -> ModelResponse:
        content = self.respond(request)
        calls_tools = any(isinstance(b, ToolUseBlock) for b in content)
        return ModelResponse(
            id="msg_" + request.fingerprint()[:24],
            model=request.model,
            content=tuple(content),
            stop_reason="tool_use" if calls_tools else "end_turn",
            usage=Usage(output_tokens=40),  # the server replaces it with its own accounting
        )

    @staticmethod
    def _progress(messages: tuple[Message, ...]) -> tuple[int, int] | None:
        for message in reversed(messages):
            for result in message.tool_results:
                match = _STEP.search(result.content)
                if match:
                    return int(match.group(1)), int(match.group(2))
            task = _TASK.search(message.text) if message.role == "user" else None
            if task:
                return 0, int(task.group(1))
        return None

    def respond(self, request: ModelRequest) -> list[Block]:
        if is_summary_request(request):
            return [
                TextBlock(
                    text="<analysis>Reviewed.</analysis>\n<summary>\n"
                    + prose("summary", 600)
                    + "\n</summary>"
                )
            ]
        progress = self._progress(request.messages)
        if progress is None or progress[0] >= progress[1]:
            return [TextBlock(text="Report: " + prose("report", 300))]
        done, total = progress
        salt = request.fingerprint()[:12]
        arguments = {"n": done + 1, "total": total}
        blocks: list[Block] = [ToolUseBlock(id=f"toolu_{salt}_step", name="step", input=arguments)]
        supervisor = any(t.name == "spawn_agent" for t in request.tools)
        if supervisor and done + 1 in self.workload.delegate_at():
            for i in range(self.workload.children):
                task = f"Sub-question {done + 1}.{i}: Do {self.workload.child_steps} steps."
                blocks.append(
                    ToolUseBlock(
                        id=f"toolu_{salt}_spawn{i}",
                        name="spawn_agent",
                        input={"agent": "researcher", "task": task},
                    )
                )
        return blocks


# ----------------------------------------------------------------------------- stand-ins
class StandInSpawn:
    """A minimal ``spawn_agent`` (fresh children only), used when the runtime has none."""

    name = "spawn_agent"

    def applies_to(self, agent: Agent) -> bool:
        return bool(agent.subagents)

    def definition(self, agent: Agent) -> ToolDefinition:
        return ToolDefinition(
            name=self.name,
            description="Delegate a task to a sub-agent; returns its final report.",
            input_schema={
                "type": "object",
                "properties": {
                    "agent": {"type": "string", "enum": [a.name for a in agent.subagents]},
                    "task": {"type": "string"},
                },
                "required": ["agent", "task"],
            },
        )

    async def run(self, run: AgentRun, call: ToolUseBlock) -> ToolOutcome:
        child_agent = run.agent.subagent(str(call.input["agent"]))
        if child_agent is None:
            return ToolOutcome("no such sub-agent", is_error=True)
        child = await AgentRun.start(
            run.env,
            child_agent,
            str(call.input["task"]),
            parent_run_id=run.id,
            parent_call_id=call.id,
            depth=run.record.depth + 1,
            mode="fresh",
        )
        return ToolOutcome(await child.drive())


class StandInCompaction(PassThroughPipeline):
    """Window compaction (drop the oldest turns, keep the last tool round) when over the
    threshold, then rebuild the snapshot — used when the runtime has no compaction."""

    async def before_call(self, run: ContextView) -> ContextChange | None:
        if run.context_tokens <= run.threshold or len(run.context) < 4:
            return None
        kept = tuple(run.context[-2:])
        summary = Message.user("<summary>Earlier steps were dropped.</summary>")
        boundary = BoundaryRecord(
            run_id=run.id,
            kind="compaction",
            prefix=messages_to_json([summary]),
            ranges=json.dumps([[run.next_seq - len(kept), None]]),
            created=time.time(),
            strategy="window",
            trigger="threshold",
        )
        commit = BoundaryCommit(boundary, context=(summary, *kept), next_seq=run.next_seq)
        return ContextChange(commits=(commit,), rebuild_prompt=True)


def runtime_parts() -> tuple[ContextPipeline | None, tuple[BuiltinTool, ...] | None, list[str]]:
    """The runtime's own sub-agents/compaction when present, else the stand-ins."""
    notes = []
    builtins: tuple[BuiltinTool, ...] | None = None
    if not any(b.name == "spawn_agent" for b in default_builtins()):
        builtins = (*default_builtins(), StandInSpawn())
        notes.append("sub-agents: stand-in spawn_agent (the runtime has no spawn_agent built-in)")
    pipeline: ContextPipeline | None = None
    if isinstance(default_pipeline(), PassThroughPipeline):
        pipeline = StandInCompaction()
        notes.append("compaction: stand-in window compaction (the runtime's pipeline does none)")
    return pipeline, builtins, notes


# ----------------------------------------------------------------------------- variants
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {"agent": {}, "policy": {}},
    "timestamp, no snapshot": {
        "agent": {"date_format": "%Y-%m-%dT%H:%M:%S.%f"},
        "policy": {"system_prompt_snapshot": False},
    },
    "no breakpoints": {"agent": {}, "policy": {"cache_breakpoints": False}},
}


def agents(workspace: Path, variant: dict[str, Any]) -> Agent:
    def policy(window: int) -> ContextPolicy:
        return ContextPolicy(window=window, compact_at=0.6, keep_recent=4, **variant["policy"])

    common: dict[str, Any] = {
        "model": MODEL,
        "tools": [step],
        "workspace": workspace,
        "include_date": True,
        **variant["agent"],
    }
    researcher = Agent(
        name="researcher",
        description="Researches one sub-question in numbered steps.",
        instructions=RESEARCHER_RULES,
        context=policy(9_000),
        max_turns=200,
        max_report_tokens=300,
        **common,
    )
    return Agent(
        name="supervisor",
        instructions=SUPERVISOR_RULES,
        subagents=[researcher],
        context=policy(12_000),
        max_turns=400,
        **common,
    )


@dataclass
class Result:
    variant: str
    model_calls: int = 0
    agent_turns: int = 0
    runs: int = 0
    compactions: int = 0
    input_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    uncached: int = 0
    cost: float = 0.0
    breaks: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def read_share(self) -> float:
        return self.cache_read / self.input_tokens if self.input_tokens else 0.0


async def run_variant(name: str, workload: Workload, folder: Path) -> Result:
    workspace = folder / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "AGENTS.md").write_text("Project conventions: " + prose("agents", 1500))
    (workspace / "MEMORY.md").write_text("- " + prose("memory", 600))
    supervisor = agents(workspace, VARIANTS[name])
    pipeline, builtins, _ = runtime_parts()
    prices = PriceTable()
    started = time.perf_counter()
    async with MessagesServer(WorkloadPolicy(workload), min_cache_tokens=MIN_CACHE_TOKENS) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        async with Runtime(
            db=folder / f"{name.replace(' ', '_').replace(',', '')}.db",
            model=model,
            pipeline=pipeline,
            builtins=builtins,
        ) as rt:
            result = await rt.run(
                supervisor, f"Investigate the question. Do {workload.supervisor_steps} steps."
            )
            session = result.session_id
            runs = await rt.store.list_runs(session)
            calls = [c for c in await rt.store.session_calls(session) if c.status == "ok"]
            boundaries = await rt.store.list_boundaries(session_id=session)
            breaks = await rt.store.list_cache_breaks(session)
        await model.aclose()
    out = Result(variant=name, seconds=time.perf_counter() - started)
    cost = Cost()
    for record in srv.log:
        if record.endpoint != "messages" or record.usage is None:
            continue
        usage = record.usage
        out.model_calls += 1
        out.input_tokens += usage.total_input_tokens
        out.cache_read += usage.cache_read_input_tokens
        out.cache_write += usage.cache_creation_input_tokens
        out.uncached += usage.input_tokens
        cost = cost + (prices.cost(MODEL, usage) or Cost())
    out.cost = cost.total
    out.agent_turns = len(calls)
    out.runs = len(runs)
    out.compactions = sum(1 for b in boundaries if b.kind == "compaction" and b.status == "ok")
    out.breaks = dict(sorted(Counter(str(b["cause"]) for b in breaks).items()))
    return out


def table(results: list[Result]) -> str:
    header = (
        f"{'variant':<24} {'calls':>5} {'turns':>5} {'runs':>4} {'compact':>7} "
        f"{'input tok':>10} {'cache read':>10} {'write':>9} {'uncached':>9} "
        f"{'est. $':>8}  cache breaks"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        breaks = ", ".join(f"{k} {v}" for k, v in r.breaks.items()) or "none"
        lines.append(
            f"{r.variant:<24} {r.model_calls:>5} {r.agent_turns:>5} {r.runs:>4} "
            f"{r.compactions:>7} {r.input_tokens:>10} {r.read_share:>10.1%} "
            f"{r.cache_write:>9} {r.uncached:>9} {r.cost:>8.4f}  {breaks}"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    workload = Workload.for_turns(args.turns)
    _, _, notes = runtime_parts()
    results = []
    with tempfile.TemporaryDirectory(prefix="anabranch-cache-bench-") as tmp:
        for name in VARIANTS:
            results.append(await run_variant(name, workload, Path(tmp) / "v" / name.split()[0]))
    if args.json:
        print(json.dumps([{**asdict(r), "read_share": r.read_share} for r in results], indent=2))
        return 0
    print(
        f"workload: supervisor {workload.supervisor_steps} steps, {workload.delegations} "
        f"delegations x {workload.children} researchers x {workload.child_steps} steps "
        f"(~{workload.turns} agent turns); model {MODEL} prices; server min cacheable "
        f"prefix {MIN_CACHE_TOKENS} tokens"
    )
    for note in notes:
        print(f"note: {note}")
    print()
    print(table(results))
    default = results[0]
    verdict = "met" if default.read_share >= GOAL else "NOT met"
    print(
        f"\ngoal: >= {GOAL:.0%} of input tokens from cache with the defaults: {verdict} "
        f"({default.read_share:.1%}, {default.compactions} compactions)"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=200, help="agent turns (default 200)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return anyio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
