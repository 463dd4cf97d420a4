"""Benchmark: what memory around compaction costs, per configuration, in one process.

One reader agent (``ContextPolicy(window=6_000)``) reads ``rounds`` long document parts
with the offline ``TestModel``, so it compacts several times. Its memory folder holds
``seeded`` memories about the document. Three configurations run back to back on the
same workload:

- ``off``: memory, but no re-selection after compaction and no extraction;
- ``reselect``: relevant memories chosen again after every compaction (keywords);
- ``extract``: re-selection plus ``extract_before_compaction``.

For each: model requests by purpose, compactions, input tokens sent (the test model's
usage, which is the runtime's own estimate), memories saved, and wall time. Timings are
given as ratios to ``off``; the machine is shared, so read them as rough.

    python -m bench.memory [--rounds 12] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from anabranch import Agent, ContextPolicy, Memory, Runtime, ToolContext, tool
from anabranch.memory import MemoryFolder
from anabranch.memory._extract import EXTRACT_TOOL
from anabranch.messages import ModelRequest, ModelResponse
from anabranch.testing import TestModel
from anabranch.testing._models import is_summary_request
from bench.common import noop_tracer_provider

TASK = "I prefer metric units in every answer. Read every part of the field manual."


@tool
async def read(part: int, ctx: ToolContext) -> str:
    """Read one part of the field manual."""
    return f"part {part} of the field manual: " + "survey stations and bearings " * 120


class Counting:
    def __init__(self, rounds: int) -> None:
        self.inner = TestModel(rounds=rounds, skip_tools=("recall", "forget", "remember"))
        self.kinds: dict[str, int] = {}
        self.input_tokens = 0

    async def request(self, request: ModelRequest) -> ModelResponse:
        response = await self.inner.request(request)
        if request.settings.tool_choice == EXTRACT_TOOL:
            kind = "extract"
        elif is_summary_request(request):
            kind = "summary"
        else:
            kind = "turn"
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        self.input_tokens += response.usage.input_tokens
        return response


def _seed(root: Path, count: int) -> None:
    folder = MemoryFolder(root)
    for i in range(count):
        folder.write(
            name=f"manual-note-{i}",
            description=f"Field manual survey stations note {i}",
            type="reference",
            content=f"Survey station {i} bearings are in the field manual, part {i}.",
        )


async def one(config: str, rounds: int, seeded: int, folder: Path) -> dict[str, Any]:
    root = folder / config / "memory"
    shutil.rmtree(folder / config, ignore_errors=True)
    _seed(root, seeded)
    memory = Memory(
        dir=root,
        select=2,
        reselect_after_compaction=config != "off",
        extract_before_compaction=config == "extract",
    )
    agent = Agent(
        name="reader",
        model="reader-model",
        instructions="Read the parts, then summarize.",
        tools=[read],
        context=ContextPolicy(window=6_000, compact_at=0.6, output_reserve=300, keep_recent=2),
        max_tokens=300,
        memory=memory,
    )
    model = Counting(rounds)
    provider, _ = noop_tracer_provider()
    started = time.perf_counter()
    async with Runtime(db=folder / config / "s.db", model=model, tracer_provider=provider) as rt:
        result = await rt.run(agent, TASK)
    elapsed = time.perf_counter() - started
    saved = [m.name for m in MemoryFolder(root).all() if m.source.message_range is not None]
    return {
        "status": result.status,
        "requests": dict(sorted(model.kinds.items())),
        "input_tokens": model.input_tokens,
        "extracted_memories": len(saved),
        "seconds": round(elapsed, 3),
    }


async def main(rounds: int, repeat: int, seeded: int) -> dict[str, Any]:
    out: dict[str, Any] = {"rounds": rounds, "seeded": seeded, "repeat": repeat}
    with tempfile.TemporaryDirectory() as tmp:
        runs: dict[str, list[dict[str, Any]]] = {"off": [], "reselect": [], "extract": []}
        for _ in range(repeat):  # interleaved, so a noisy minute hits every config
            for config in runs:
                runs[config].append(await one(config, rounds, seeded, Path(tmp)))
    base = min(r["seconds"] for r in runs["off"])
    for config, results in runs.items():
        best = min(r["seconds"] for r in results)
        out[config] = {**results[0], "best_seconds": best, "time_ratio": round(best / base, 2)}
        out[config].pop("seconds")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seeded", type=int, default=20)
    args = parser.parse_args()
    print(json.dumps(anyio.run(main, args.rounds, args.repeat, args.seeded), indent=1))
