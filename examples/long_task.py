"""A long task that compacts many times, offline: each agent at its own small window.

A supervisor (window 4,000 tokens) delegates to an archivist (2,500 tokens, ``summarize``
with a cheaper summarizer) and an analyst (3,000 tokens, ``verbatim``). Every tool returns
more text than fits, so outputs are spilled and each context is compacted again and again,
independently of the others; nothing is lost (``recall`` gets any of it back).

Run it offline on the built-in test model (8 tool rounds per task, ``OFFLINE_MODEL``
below), then inspect:

    anabranch run examples/long_task.py:supervisor "Audit the archive" --offline --db long.db
    anabranch compactions <ID> --db long.db        # or: python examples/long_task.py
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import anyio
from pydantic import Field

from anabranch import Agent, ContextPolicy, Model, RunResult, Runtime, ToolContext, tool
from anabranch.store import BoundaryRecord
from anabranch.testing import TestModel

OFFLINE_MODEL = TestModel(rounds=8)
"""What ``anabranch run examples/long_task.py:supervisor ... --offline`` runs on."""

TASK = "Write a short history of the river survey from the archive, with the open questions."


def _prose(seed: str, sentences: int) -> str:
    """Deterministic filler text (the same call id always reads the same page)."""
    words = ["survey", "river", "bank", "flood", "ledger", "channel", "gauge", "silt", "ford"]
    digest = hashlib.sha256(seed.encode()).digest()
    out = []
    for i in range(sentences):
        picked = [words[(digest[(i + j) % len(digest)] + j) % len(words)] for j in range(9)]
        out.append(" ".join(picked).capitalize() + ".")
    return " ".join(out)


@tool
async def read_chapter(
    chapter: Annotated[int, Field(description="Chapter number, from 1", ge=1)],
    ctx: ToolContext,
) -> str:
    """Read one chapter of the survey archive (long)."""
    return f"Chapter {chapter} (read {ctx.call_id}).\n" + _prose(ctx.call_id, 60)


@tool
async def search_ledger(
    words: Annotated[str, Field(description="Words to look for in the survey ledger")],
    ctx: ToolContext,
) -> str:
    """Search the survey ledger; returns matching entries."""
    return f"Ledger entries for {words!r}:\n" + _prose(ctx.call_id + words, 16)


archivist = Agent(
    name="archivist",
    model="claude-sonnet-4-6",
    description="Reads archive chapters and reports what they say.",
    instructions="Read the chapters you need and report the facts with chapter numbers.",
    tools=[read_chapter],
    context=ContextPolicy(
        window=2_500,
        compact_at=0.7,
        output_reserve=256,
        keep_recent=4,
        tool_result_max_chars=2_000,
        tool_result_preview_chars=900,
        summarizer_model="claude-haiku-4-5",
        fallback_summarizer_model="claude-sonnet-4-6",
    ),
    max_turns=60,
    max_report_tokens=300,
)

analyst = Agent(
    name="analyst",
    model="claude-sonnet-4-6",
    description="Searches the ledger and lists open questions.",
    instructions="Search the ledger and list the open questions it raises.",
    tools=[search_ledger],
    context=ContextPolicy(
        window=3_000,
        compact_at=0.6,
        output_reserve=256,
        keep_recent=4,
        strategy="verbatim",
        tool_result_max_chars=1_000,
        tool_result_preview_chars=300,
    ),
    max_turns=60,
    max_report_tokens=300,
)

supervisor = Agent(
    name="supervisor",
    model="claude-opus-4-8",
    instructions="Delegate reading to the archivist and questions to the analyst, then write.",
    tools=[search_ledger],
    subagents=[archivist, analyst],
    context=ContextPolicy(
        window=4_000,
        compact_at=0.7,
        output_reserve=512,
        keep_recent=6,
        tool_result_max_chars=1_500,
        tool_result_preview_chars=400,
    ),
    max_turns=60,
)


async def run_long_task(
    model: Model, db: str | Path, *, task: str = TASK
) -> tuple[RunResult, list[tuple[str, BoundaryRecord]]]:
    """Run the supervisor on ``model``; returns the result and every (agent, boundary)."""
    async with Runtime(db=db, model=model) as rt:
        result = await rt.run(supervisor, task, source=f"{__file__}:supervisor")
        runs = {r.id: r.agent_name for r in await rt.store.list_runs(result.session_id)}
        boundaries = await rt.store.list_boundaries(session_id=result.session_id)
    return result, [(runs[b.run_id], b) for b in boundaries]


def main(argv: Sequence[str] | None = None) -> None:

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="long_task.db")
    parser.add_argument("--rounds", type=int, default=8, help="tool rounds per agent task")
    args = parser.parse_args(argv)
    result, boundaries = anyio.run(run_long_task, TestModel(rounds=args.rounds), args.db)
    print(f"session {result.session_id}: {result.status}")
    for agent, b in boundaries:
        print(
            f"  {agent:<11} {b.kind:<10} {b.strategy or '-':<9} {b.trigger or '-':<8} "
            f"{b.tokens_before}→{b.tokens_after} tokens  {b.status}"
        )
    print(f"details: anabranch compactions {result.session_id} --db {args.db}")


if __name__ == "__main__":
    main()
