"""The live tree on a terminal: fed by a real session's events; ``anabranch run`` on a pty."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from anabranch import Agent, Runtime
from anabranch.cli._live import LiveTree, context_bar
from anabranch.testing import TestModel

from .compaction_helpers import small_agent
from .test_cli import EXAMPLE, ROOT

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_the_context_bar_marks_threshold_and_fill() -> None:
    bar = context_bar(500, 700, 1000, width=10).plain
    assert bar == "[█████··|··]"
    assert context_bar(0, 0, 1000, width=4).plain == "[····]"


@pytest.mark.anyio
async def test_the_tree_follows_a_supervisor_and_its_compacting_children(tmp_path: Path) -> None:
    out = io.StringIO()
    live = LiveTree(out, force_terminal=True)
    boss = Agent(name="boss", model="test-model", subagents=[small_agent("worker")])
    async with Runtime(db=tmp_path / "t.db", model=TestModel(rounds=10), on_event=live) as rt:
        with anyio.fail_after(60):
            result = await rt.run(boss, "dig")
    assert result.status == "done"
    (root_id,) = live.roots
    root = live.runs[root_id]
    assert root.agent == "boss" and root.status == "done" and root.children
    workers = [live.runs[c] for c in root.children]
    assert all(w.status == "done" and w.window == 1500 for w in workers)
    assert sum(w.compactions for w in workers) >= 1
    final = ANSI.sub("", out.getvalue())
    assert "boss [done]" in final and "worker [done]" in final and "compactions" in final


def test_run_on_a_terminal_draws_the_tree(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    env["COLUMNS"] = "200"
    process = subprocess.Popen(
        [sys.executable, "-m", "anabranch", "run", f"{EXAMPLE}:supervisor", "tty please"]
        + ["--offline", "--db", str(tmp_path / "tty.db")],
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 120
    try:
        while True:  # read the terminal as it is drawn (a full pty would block the child)
            assert time.monotonic() < deadline, "the run did not finish"
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            elif process.poll() is not None:
                break
        assert process.stdout is not None
        stdout = process.stdout.read().decode()
        process.wait(timeout=30)
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0
    screen = ANSI.sub("", b"".join(chunks).decode("utf-8", "replace"))
    assert "supervisor [done]" in screen
    assert "literature_researcher [done]" in screen
    assert "█" in screen or "·" in screen  # the context bar
    assert stdout.startswith("Report on: tty please")
