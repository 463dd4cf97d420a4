"""What listening to events costs a run: CPU per model call with nobody listening, with an
``on_event`` callback, and with a stream that reads nothing until the run is over.

    python bench/events.py [--calls 400] [--repeat 3]

Prints the medians and the ratios to "nobody listening", measured in the same run (a
timing is never a test: nothing here gates anything).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from anabranch import Agent, Runtime, tool  # noqa: E402
from anabranch.testing import TestModel  # noqa: E402


@tool
def note(topic: str) -> str:
    """Take a note."""
    return f"noted {topic}"


async def _one(mode: str, calls: int, db: Path) -> float:
    agent = Agent(name="bench", model="m", tools=[note], max_turns=calls + 5)
    seen: list[Any] = []
    over = anyio.Event()

    def watch(event: Any) -> None:
        seen.append(event)
        if event.kind == "session_finished":
            over.set()

    rt = Runtime(
        db=db,
        model=TestModel(rounds=calls - 1),
        synchronous="OFF",
        on_event=watch if mode != "nobody listening" else None,
    )
    async with rt:
        started = time.process_time()
        if mode == "lagging stream":  # (plus the callback that says when it is over)
            async with rt.stream(agent, "go") as events:
                await over.wait()  # a consumer that reads nothing until the run is over
                drained = [e async for e in events]
                assert drained[-1].kind == "session_finished"
        else:
            result = await rt.run(agent, "go")
            assert result.status == "done"
        return (time.process_time() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    modes = ("nobody listening", "callback", "lagging stream")
    figures: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            for i, mode in enumerate(modes):
                db = Path(tmp) / f"{r}-{i}.db"
                figures[mode].append(anyio.run(_one, mode, args.calls, db))
    base = statistics.median(figures[modes[0]])
    for mode in modes:
        median = statistics.median(figures[mode])
        print(f"{mode:<18} {median * 1000:7.3f} ms CPU per call   x{median / base:.2f}")


if __name__ == "__main__":
    main()
