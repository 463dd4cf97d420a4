"""Fidelity benchmark: how many facts survive compaction under pressure (issue 13).

    python bench/fidelity.py [--only researchers-6,deep-tree,...] [--kills 15] [--out FILE]

Every scenario runs through the real ``anthropic`` SDK against the project's own
``MessagesServer``. The server's policy plays a *perfect* model: a worker calls its tool
``calls`` times, then reports every fact token it can see; a manager spawns its sub-agents,
then reports every fact token it can see; a summarizer keeps every fact token it is shown.
So any fact that does not reach the root's final answer was lost by the runtime.

Every tool result carries unique fact tokens (``fct`` + 10 characters). Per scenario:

- **in view**: share of the facts produced by tool calls that reach the root's answer;
- **recallable**: share whose token ``recall(query=token)`` finds in the producing run's
  own history (the snippet, or one of the first three hits read in full);
- compactions per agent (and how many grew the context, failed, or came on the turn right
  after another), breaker openings, summarizer tokens (input + output), wall time;
- **waited**: model calls that waited on a summarizer (a summary made at the threshold, or
  a summary ahead still in flight there) and **ahead**: summaries computed ahead and
  swapped in without a wait (the ``*-ahead`` scenarios turn ``compact_ahead_at`` on).

The ``deep-tree-kill9`` scenario drives the session in child processes and SIGKILLs them
(at a request the server receives, or on a timer) ``--kills`` times, resuming each time.
Nothing here is a test; timings never gate anything.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
for entry in (ROOT, ROOT / "src"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

from anabranch import AnthropicModel, RetryPolicy, Runtime  # noqa: E402
from anabranch.messages import ToolUseBlock  # noqa: E402
from anabranch.runtime._recall import RecallTool  # noqa: E402
from anabranch.testing import MessagesServer, TestModel  # noqa: E402
from bench.fidelity_model import (  # noqa: E402
    FACT,
    PAGE,
    SCENARIOS,
    FidelityPolicy,
    Scenario,
    agents_for,
)

RETRY = RetryPolicy(max_attempts=6, base_delay=0.01, max_delay=0.05)


async def drive(scenario: Scenario, db: Path, base_url: str, session: str | None) -> None:
    """Run (or resume) the scenario's session; prints the session id as soon as it exists."""
    model = AnthropicModel(base_url=base_url, api_key="test")
    root = agents_for(scenario)
    try:
        async with Runtime(db=db, model=model, retry=RETRY, synchronous="NORMAL") as rt:
            if session is None:
                await rt.run(root, "Study every area; report every finding.", on_session=_announce)
            else:
                await rt.resume(session, root)
    finally:
        await model.aclose()


def _announce(session_id: str) -> None:
    print(f"SESSION {session_id}", flush=True)


async def _drive_in_process(scenario: Scenario, db: Path, base_url: str) -> str:
    ids: list[str] = []
    model = AnthropicModel(base_url=base_url, api_key="test")
    try:
        async with Runtime(db=db, model=model, retry=RETRY, synchronous="NORMAL") as rt:
            try:
                await rt.run(
                    agents_for(scenario),
                    "Study every area; report every finding.",
                    on_session=ids.append,
                )
            except Exception as exc:  # a failed run is a result of the benchmark
                print(f"  {scenario.name}: run failed: {type(exc).__name__}: {exc}")
    finally:
        await model.aclose()
    return ids[0]


async def _drive_killed(
    scenario: Scenario,
    db: Path,
    server: MessagesServer,
    policy: FidelityPolicy,
    kills: int,
    seed: int,
) -> tuple[str, int]:
    rng = random.Random(seed)
    session: str | None = None
    attempts = 0
    while True:
        attempts += 1
        command = [
            sys.executable,
            __file__,
            "--drive",
            scenario.name,
            "--db",
            str(db),
            "--base-url",
            server.base_url,
        ]
        if session:
            command += ["--session", session]
        process = await anyio.open_process(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT
        )
        if policy.kills < kills:
            policy.arm(process.pid, rng.randint(1, 8))
        out = b""
        with anyio.fail_after(600):
            assert process.stdout is not None
            async for chunk in process.stdout:
                out += chunk
            await process.wait()
        policy.victim = policy.kill_at = None
        match = re.search(rb"SESSION (\S+)", out)
        if session is None and match:
            session = match.group(1).decode()
        if process.returncode == 0 and session is not None:
            return session, attempts
        if attempts > kills * 3 + 5:
            raise RuntimeError(f"{scenario.name}: did not finish after {attempts} attempts")


# ---------------------------------------------------------------------------- measuring
@dataclass
class AgentFigures:
    compactions: int = 0
    grew: int = 0
    failed: int = 0
    consecutive: int = 0
    breaker: int = 0
    status: str = ""
    facts: int = 0
    waited: int = 0
    ahead: int = 0


@dataclass
class Figures:
    scenario: str
    facts: int = 0
    in_view: int = 0
    recallable: int = 0
    failed_runs: int = 0
    seconds: float = 0.0
    summarizer_tokens: int = 0
    summaries: int = 0
    too_long: int = 0
    kills: int = 0
    waited: int = 0
    ahead: int = 0
    agents: dict[str, AgentFigures] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "agents"}
        data["in_view_pct"] = round(100 * self.in_view / self.facts, 1) if self.facts else 0.0
        data["recallable_pct"] = round(100 * self.recallable / self.facts, 1) if self.facts else 0.0
        data["agents"] = {k: v.__dict__ for k, v in self.agents.items()}
        return data


async def measure(scenario: Scenario, db: Path, session_id: str, figures: Figures) -> None:
    from anabranch.runtime._loop import AgentRun

    root_agent = agents_for(scenario)
    agents = {root_agent.name: root_agent}
    stack = [root_agent]
    while stack:
        for child in stack.pop().subagents:
            agents[child.name] = child
            stack.append(child)
    # measuring makes no model call: an offline model, so no credentials are needed
    async with Runtime(db=db, model=TestModel(), synchronous="NORMAL") as rt:
        store = rt.store
        runs = await store.list_runs(session_id)
        root = next(r for r in runs if r.parent_run_id is None)
        answer = set(FACT.findall(root.output or ""))
        env = rt.environment(session_id)
        recall = RecallTool()
        for record in runs:
            agent_figures = figures.agents.setdefault(record.agent_name, AgentFigures())
            agent_figures.status = record.status
            figures.failed_runs += record.status != "done"
            boundaries = await store.list_boundaries(run_id=record.id)
            for boundary in boundaries:
                if boundary.kind == "breaker":
                    agent_figures.breaker += 1
                if boundary.kind != "compaction":
                    continue
                if boundary.status != "ok":
                    agent_figures.failed += 1
                    continue
                agent_figures.compactions += 1
                if (boundary.tokens_after or 0) >= (boundary.tokens_before or 0):
                    agent_figures.grew += 1
                if boundary.strategy == "summarize":
                    waited = _waited_on_summarizer(boundary)
                    agent_figures.waited += waited
                    agent_figures.ahead += not waited
                    figures.waited += waited
                    figures.ahead += not waited
            agent_figures.consecutive = _consecutive(
                await store.load_messages(record.id), boundaries
            )
            produced = await _produced_facts(store, record.id)
            agent_figures.facts = len(produced)
            if not produced:
                continue
            run = await AgentRun.load(env, agents[record.agent_name], record)
            for token in produced:
                figures.facts += 1
                figures.in_view += token in answer
                figures.recallable += await _recallable(recall, run, token)


async def _produced_facts(store: Any, run_id: str) -> list[str]:
    """Fact tokens of every lookup result of the run (full outputs, not previews)."""
    messages = await store.load_messages(run_id)
    uses = {}
    for record in messages:
        if record.role == "assistant":
            for block in json.loads(record.content):
                if block.get("type") == "tool_use" and block.get("name") == "lookup":
                    uses[block["id"]] = block
    events = await store.tool_events(run_id, list(uses))
    found: dict[str, None] = {}
    for event in events:
        if event.event == "finished" and event.content:
            found.update(dict.fromkeys(FACT.findall(event.content)))
    return list(found)


def _waited_on_summarizer(boundary: Any) -> bool:
    """Whether the call after this summary waited for it: it was made at the threshold, or
    computed ahead but still in flight there."""
    if boundary.trigger != "ahead":
        return True
    return bool(json.loads(boundary.extra or "{}").get("ahead", {}).get("waited"))


def _consecutive(messages: list[Any], boundaries: list[Any]) -> int:
    """Compactions whose previous compaction came one model turn before."""
    ok = [b for b in boundaries if b.kind == "compaction" and b.status == "ok"]
    stamps = sorted(r.created for r in messages if r.role == "assistant" and r.kind == "message")
    count = 0
    for before, after in zip(ok, ok[1:], strict=False):
        turns = sum(1 for t in stamps if before.created < t < after.created)
        count += turns <= 1
    return count


async def _recallable(recall: RecallTool, run: Any, token: str) -> bool:
    found = await recall.run(
        run, ToolUseBlock(id="toolu_bench_q", name="recall", input={"query": token})
    )
    if token in found.content:
        return True
    for handle in re.findall(r"id=(msg-\d+|out_\w+)", found.content)[:3]:
        offset = 0
        while True:
            page = await recall.run(
                run,
                ToolUseBlock(
                    id="toolu_bench_r", name="recall", input={"id": handle, "offset": offset}
                ),
            )
            if token in page.content:
                return True
            more = PAGE.search(page.content)
            if not more:
                break
            offset = int(more.group(2))
    return False


async def run_scenario(scenario: Scenario, folder: Path, kills: int, seed: int) -> Figures:
    policy = FidelityPolicy(scenario)
    figures = Figures(scenario.name)
    db = folder / f"{scenario.name}.db"
    started = time.perf_counter()
    async with MessagesServer(policy=policy, context_limit=10_000_000) as server:
        if scenario.kills:
            session, _ = await _drive_killed(scenario, db, server, policy, kills, seed)
        else:
            session = await _drive_in_process(scenario, db, server.base_url)
    figures.seconds = round(time.perf_counter() - started, 2)
    figures.kills = policy.kills
    figures.summarizer_tokens = policy.counters.summarizer_input + policy.counters.summarizer_output
    figures.summaries = policy.counters.summaries
    figures.too_long = policy.counters.too_long
    await measure(scenario, db, session, figures)
    return figures


def print_table(rows: list[Figures]) -> None:
    print(
        f"{'scenario':<22}{'facts':>6}{'in view':>9}{'recall':>8}{'failed':>7}"
        f"{'summ tok':>10}{'waited':>7}{'ahead':>6}{'kills':>6}{'secs':>7}"
    )
    for f in rows:
        r = f.row()
        print(
            f"{f.scenario:<22}{f.facts:>6}{r['in_view_pct']:>8}%{r['recallable_pct']:>7}%"
            f"{f.failed_runs:>7}{f.summarizer_tokens:>10}{f.waited:>7}{f.ahead:>6}"
            f"{f.kills:>6}{f.seconds:>7}"
        )
        for name, a in f.agents.items():
            print(
                f"    {name:<14} compactions={a.compactions} grew={a.grew} failed={a.failed} "
                f"consecutive={a.consecutive} breaker={a.breaker} waited={a.waited} "
                f"ahead={a.ahead} status={a.status}"
            )


async def main_async(args: argparse.Namespace) -> int:
    names = args.only.split(",") if args.only else list(SCENARIOS)
    rows = []
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(args.keep or temporary)
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            rows.append(await run_scenario(SCENARIOS[name], folder, args.kills, args.seed))
    print_table(rows)
    if args.out:
        Path(args.out).write_text(json.dumps([r.row() for r in rows], indent=2) + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated scenario names")
    parser.add_argument("--kills", type=int, default=15)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--out", help="write the figures as JSON here")
    parser.add_argument("--keep", help="keep the databases in this folder")
    parser.add_argument("--drive", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    parser.add_argument("--session", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        anyio.run(drive, SCENARIOS[args.drive], Path(args.db), args.base_url, args.session)
        return 0
    return anyio.run(main_async, args)


if __name__ == "__main__":
    sys.exit(main())
