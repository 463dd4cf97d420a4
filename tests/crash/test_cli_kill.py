"""``kill -9`` of ``anabranch run`` mid-tool, then ``anabranch sessions`` and the resume
command it prints: the session finishes, each tool's side effect happened once."""

from __future__ import annotations

import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

AGENT = '''
import os, sqlite3, time
from pathlib import Path
from anabranch import Agent, ToolContext, tool

HERE = Path(__file__).parent

def _notify_committed() -> bool:
    conn = sqlite3.connect(HERE / "runs.db", timeout=30)
    try:
        return conn.execute(
            "SELECT 1 FROM tool_events WHERE name = 'notify' AND event = 'finished'"
        ).fetchone() is not None
    finally:
        conn.close()

@tool
def charge(amount: int, ctx: ToolContext) -> str:
    """Charge the customer (a side effect, made idempotent by the call id)."""
    ledger = HERE / "ledger.tsv"
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    if not any(line.startswith(ctx.call_id + "\\t") for line in lines):
        with open(ledger, "a") as f:
            f.write(f"{ctx.call_id}\\t{amount}\\n")
    deadline = time.monotonic() + 60
    while not _notify_committed():     # so the kill lands after notify's result is stored
        assert time.monotonic() < deadline, "notify's result was never committed"
        time.sleep(0.02)
    (HERE / "charging").write_text(ctx.call_id)
    deadline = time.monotonic() + 60
    while (HERE / "hold").exists():     # the first process is killed in here
        assert time.monotonic() < deadline, "the test never released the hold"
        time.sleep(0.02)
    return f"charged {amount}"

@tool
def notify(amount: int) -> str:
    """Tell the customer."""
    with open(HERE / "notified.tsv", "a") as f:
        f.write(f"{amount}\\n")
    return "notified"

agent = Agent(name="billing", instructions="Charge, then notify.", tools=[charge, notify])
'''


def anabranch(*args: str, wait: bool = True) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env["ANTHROPIC_OPEN_TELEMETRY"] = "false"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    process = subprocess.Popen(
        [sys.executable, "-m", "anabranch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    if wait:
        process.wait(timeout=120)
    return process


@pytest.mark.slow
def test_kill_9_of_anabranch_run_then_anabranch_resume(tmp_path: Path) -> None:
    (tmp_path / "billing.py").write_text(AGENT)
    (tmp_path / "hold").touch()
    db = tmp_path / "runs.db"
    run = anabranch(
        "run", f"{tmp_path}/billing.py:agent", "charge 5", "--offline", "--db", str(db), wait=False
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "charging").exists():
        assert run.poll() is None, run.communicate()
        assert time.monotonic() < deadline, "the tool never started"
        time.sleep(0.02)
    os.kill(run.pid, signal.SIGKILL)
    _, stderr = run.communicate(timeout=30)
    assert run.returncode == -signal.SIGKILL
    session_id = re.search(r"session (ses_[0-9a-f]+)", stderr)
    assert session_id, stderr
    (tmp_path / "hold").unlink()
    with closing(sqlite3.connect(db)) as conn:  # the dead process's lease has not expired:
        (expires,) = conn.execute("SELECT expires FROM leases").fetchone()
    assert expires > time.time() + 5  # resuming must take it over because its owner died

    sessions = anabranch("sessions", "--db", str(db))
    out = sessions.stdout.read() if sessions.stdout else ""
    assert sessions.returncode == 0
    assert re.search(rf"^{session_id.group(1)}\s+interrupted\b", out, re.MULTILINE), out
    command = next(line.strip() for line in out.splitlines() if "anabranch resume" in line)
    argv = shlex.split(command)
    assert argv[:3] == ["anabranch", "resume", session_id.group(1)]

    resume = anabranch(*argv[1:], "--offline")  # the run was offline, so is its resume
    output = resume.stdout.read() if resume.stdout else ""
    assert resume.returncode == 0, resume.stderr.read() if resume.stderr else ""
    assert "charge (ok): charged" in output and "notify (ok): notified" in output

    ledger = (tmp_path / "ledger.tsv").read_text().splitlines()
    assert len(ledger) == 1  # retried with the same call id, so charged once
    assert ledger[0].startswith((tmp_path / "charging").read_text())
    assert len((tmp_path / "notified.tsv").read_text().splitlines()) == 1

    again = anabranch("sessions", "--db", str(db))
    assert "anabranch resume" not in (again.stdout.read() if again.stdout else "")
