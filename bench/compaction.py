"""Benchmark 4: compaction of a ~100k-token context, per strategy, and fact retention.

One agent holds a conversation (the persistence workload: a user turn, a tool call, a
2,000-char tool result, a reply) with the runtime's default context pipeline and
``ContextPolicy(window=128_000, compact_at=0.78125)``: compaction starts at 100,000 tokens.
Every 10th user turn and every 10th tool result carries a fact with a unique key and value
("Fact U0040: the code word for item 40 is cw...."). The conversation goes on until the run
has compacted ``k`` times; then, for every fact planted so far:

- **in context**: its value is in the run's current context (what the model would see);
- **recoverable**: otherwise, the built-in ``recall`` tool finds it: a search for the key
  shows the value, or one of the (at most 3) hits read with ``recall(id=...)`` contains it.

Per strategy (``verbatim``, ``window``, ``summarize`` with the test summarizer, which keeps
the first user request and the last three tool results): each compaction's duration, tokens
before and after (from the boundary rows), the turns between compactions, and retention.
Token counts are the runtime's own estimates; ``synchronous=NORMAL`` (fsync is not the point).
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from typing import Any

from anabranch import Agent, ContextPolicy, Message, ModelRequest, ModelResponse, Runtime
from anabranch.messages import TextBlock, ToolResultBlock, ToolUseBlock
from anabranch.runtime._loop import AgentRun
from anabranch.runtime._recall import RecallTool
from anabranch.testing import TestModel
from anabranch.testing._models import is_summary_request, usage_for
from bench.common import fresh_path, noop_tracer_provider, stats, turn_payload
from bench.ours import ChatStore, new_session

STRATEGIES = ("verbatim", "window", "summarize")
WINDOW = 128_000
COMPACT_AT = 100_000 / WINDOW
FACT_EVERY = 10


def fact(kind: str, index: int) -> tuple[str, str, str]:
    """(key, value, sentence) of the fact planted in turn ``index``."""
    key = f"{kind}{index:04d}"
    value = "cw" + hashlib.sha256(key.encode()).hexdigest()[:8]
    return key, value, f"Fact {key}: the code word for item {index} is {value}."


def user_text(index: int) -> str:
    text = turn_payload(index).user
    if index % FACT_EVERY == 0:
        return fact("U", index)[2] + " " + text
    return text


def result_text(index: int) -> str:
    text = turn_payload(index).result
    if index % FACT_EVERY == FACT_EVERY // 2:
        return text[:1_000] + " " + fact("T", index)[2] + " " + text[1_000:]
    return text


class FactModel:
    """Instant model for the conversation; answers compaction requests like TestModel."""

    def __init__(self) -> None:
        self.summarizer = TestModel()
        self.calls = 0

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        if is_summary_request(request):
            content: list[Any] = self.summarizer.respond(request)
        else:
            index = _turn_index(request.messages)
            if request.messages[-1].tool_results:
                content = [TextBlock(text=turn_payload(index).reply)]
            else:
                content = [
                    ToolUseBlock(
                        id=f"toolu_{index}", name="lookup", input={"query": f"turn {index}"}
                    )
                ]
        stop = "tool_use" if any(isinstance(b, ToolUseBlock) for b in content) else "end_turn"
        return ModelResponse(
            id=f"msg_{self.calls}",
            model=request.model,
            content=tuple(content),
            stop_reason=stop,
            usage=usage_for(request, content),
        )


def _turn_index(messages: tuple[Message, ...]) -> int:
    for message in reversed(messages):
        if message.role == "user" and not message.tool_results:
            match = re.search(r"\[turn (\d+)\]", message.text)
            if match:
                return int(match.group(1))
    return 0


def _agent(strategy: str) -> Agent:
    from anabranch import tool

    @tool(name="lookup")
    async def lookup_fact(query: str) -> str:  # the workload tool, with planted facts
        """Look something up; returns about 2,000 characters."""
        return result_text(int(query.split()[-1]))

    return Agent(
        name=f"compact_{strategy}",
        model="bench-model",
        instructions="You answer questions, using the lookup tool first.",
        tools=[lookup_fact],
        max_turns=1_000_000,
        context=ContextPolicy(window=WINDOW, compact_at=COMPACT_AT, strategy=strategy),
    )


def _render(messages: list[Message]) -> str:
    parts: list[str] = []
    for message in messages:
        for block in message.content:
            if isinstance(block, TextBlock):
                parts.append(block.text)
            elif isinstance(block, ToolResultBlock):
                parts.append(block.content)
            else:
                parts.append(str(block.input))
    return "\n".join(parts)


async def _recoverable(run: AgentRun, key: str, value: str) -> bool:
    recall = RecallTool()
    found = await recall.run(run, ToolUseBlock(id="bench_q", name="recall", input={"query": key}))
    if value in found.content:
        return True
    for handle in re.findall(r"id=(msg-\d+|out_[\w-]+)", found.content)[:3]:
        page = await recall.run(
            run, ToolUseBlock(id="bench_r", name="recall", input={"id": handle})
        )
        if value in page.content:
            return True
    return False


async def run_strategy(folder: Path, strategy: str, k: int, max_turns: int) -> dict[str, Any]:
    path = fresh_path(folder, f"compaction_{strategy}.db")
    provider, _ = noop_tracer_provider()
    agent = _agent(strategy)
    model = FactModel()
    turn_times: list[float] = []
    async with Runtime(path, model=model, tracer_provider=provider, synchronous="NORMAL") as rt:
        first = f"[turn 0] {user_text(0)}"
        env = await new_session(rt, agent, first)
        assert isinstance(env.store, ChatStore)
        started = time.perf_counter()
        run = await AgentRun.start(env, agent, first)
        await run.drive()
        turns = 1
        while run.compactions < k and turns < max_turns:
            t0 = time.perf_counter()
            await run.append(Message.user(f"[turn {turns}] {user_text(turns)}"))
            await run.drive()
            turn_times.append(time.perf_counter() - t0)
            turns += 1
        total = time.perf_counter() - started
        boundaries = [
            b
            for b in await rt.store.list_boundaries(run_id=run.id)
            if b.kind == "compaction" and b.status == "ok"
        ]
        context = _render(run.context)
        facts = [
            fact(kind, i)
            for i in range(turns)
            for kind in ("U", "T")
            if (kind == "U" and i % FACT_EVERY == 0)
            or (kind == "T" and i % FACT_EVERY == FACT_EVERY // 2)
        ]
        in_context = recovered = 0
        for key, value, _ in facts:
            if value in context:
                in_context += 1
            elif await _recoverable(run, key, value):
                recovered += 1
        context_tokens = run.context_tokens
    provider.shutdown()
    saved = [(b.tokens_before or 0) - (b.tokens_after or 0) for b in boundaries]
    return {
        "strategy": strategy,
        "turns": turns,
        "compactions": len(boundaries),
        "seconds": total,
        "compaction_s": stats([b.duration or 0.0 for b in boundaries]),
        "tokens_before": stats([float(b.tokens_before or 0) for b in boundaries]),
        "tokens_after": stats([float(b.tokens_after or 0) for b in boundaries]),
        "tokens_saved": stats([float(x) for x in saved]),
        "share_saved": stats(
            [s / b.tokens_before for s, b in zip(saved, boundaries, strict=True) if b.tokens_before]
        ),
        "turn_at_compaction": [b.messages_before for b in boundaries],
        "context_tokens_at_end": context_tokens,
        "facts": len(facts),
        "facts_in_context": in_context,
        "facts_recoverable_with_recall": recovered,
        "retention_in_context": in_context / len(facts) if facts else 0.0,
        "retention_with_recall": (in_context + recovered) / len(facts) if facts else 0.0,
        "per_turn_s": stats(turn_times),
        "model_calls": model.calls,
    }


async def benchmark(
    folder: Path, *, k: int = 3, max_turns: int = 1_500, log: Any = print
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "window": WINDOW,
        "threshold_tokens": int(WINDOW * COMPACT_AT),
        "k": k,
        "strategies": {},
    }
    for strategy in STRATEGIES:
        result = await run_strategy(folder, strategy, k, max_turns)
        result["summary"] = (
            f"{result['compactions']} compactions in {result['turns']} turns, "
            f"median {result['compaction_s']['median'] * 1e3:.1f} ms each, "
            f"saved {result['share_saved']['median']:.0%} of "
            f"{result['tokens_before']['median']:.0f} tokens; facts in context "
            f"{result['retention_in_context']:.0%}, with recall "
            f"{result['retention_with_recall']:.0%} of {result['facts']}"
        )
        out["strategies"][strategy] = result
        log(f"  compaction {strategy}: {result['summary']}")
    return out
