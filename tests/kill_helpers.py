"""``kill -9`` of ``anabranch run`` at a chosen point, against the local server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from anabranch.testing import MessagesServer

ROOT = Path(__file__).resolve().parents[1]


def cli_env(srv: MessagesServer) -> dict[str, str]:
    """The environment of an ``anabranch`` process that talks to ``srv`` (and can import
    ``anabranch`` and ``tests`` from this checkout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    paths = [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")]
    env.update(
        ANTHROPIC_BASE_URL=srv.base_url,
        ANTHROPIC_API_KEY="test",
        ANTHROPIC_OPEN_TELEMETRY="false",
        PYTHONPATH=os.pathsep.join(filter(None, paths)),
    )
    return env


async def _until(predicate: Any, what: str, process: anyio.abc.Process) -> None:
    with anyio.fail_after(90, reason=what):
        while not predicate():
            assert process.returncode is None, "anabranch run ended before the kill point"
            await anyio.sleep(0.02)


async def run_and_kill(
    srv: MessagesServer, tmp_path: Path, target: str, task: str, db: Path, *, what: str
) -> str:
    """Start ``anabranch run target task``, ``kill -9`` it once ``tmp_path/"reached"``
    exists (the test's tool makes it, then waits while ``tmp_path/"hold"`` exists), release
    the hold and return the session id."""
    command = [sys.executable, "-m", "anabranch", "run", target, task, "--db", str(db)]
    with open(tmp_path / "stderr.txt", "w") as stderr:
        run = await anyio.open_process(
            command, env=cli_env(srv), stdout=subprocess.DEVNULL, stderr=stderr
        )
        try:
            await _until((tmp_path / "reached").exists, what, run)
        finally:
            os.kill(run.pid, signal.SIGKILL)
            with anyio.fail_after(30):
                await run.wait()
    assert run.returncode == -signal.SIGKILL
    (tmp_path / "hold").unlink()
    return (tmp_path / "stderr.txt").read_text().split("session ", 1)[1].split()[0]
