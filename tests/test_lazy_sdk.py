"""The anthropic SDK is imported only when an Anthropic model is used.

It is thousands of modules and ~150k objects: every full garbage collection of a process
walks them, and it takes seconds to import. A run with another model (the offline test
model here, a user's own client elsewhere) must not load it, down to a run that compacts
and one that asks the API-side compaction step for its request.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_SCRIPT = """
import sys
import anyio
from anabranch import Agent, ContextPolicy, Runtime, tool
from anabranch.testing import TestModel

@tool
async def note(text: str) -> str:
    '''Record a note.'''
    return "noted " + text

async def main() -> None:
    agent = Agent(name="a", model="claude-sonnet-4-5", instructions="Work.", tools=[note],
                  context=ContextPolicy(window=2_000))
    async with Runtime(sys.argv[1], model=TestModel(rounds=6)) as rt:
        result = await rt.run(agent, "take notes")
    assert result.status == "done", result.status
    from anabranch.runtime import _server_compaction  # the API-side compaction step
    print("loaded" if "anthropic" in sys.modules else "absent")

anyio.run(main)
"""


def test_a_run_with_another_model_never_imports_the_anthropic_sdk(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path / "lazy.db")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "absent"

