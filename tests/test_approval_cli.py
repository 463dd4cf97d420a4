"""``anabranch approve``: a pending approval survives ``kill -9``; the answer and a resume
finish the run (a real subprocess each time)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from .helpers import kill_9_once_marked
from .test_cli import ROOT, anabranch

AGENT_FILE = textwrap.dedent(
    """
    import os, time
    from pathlib import Path
    from anabranch import Agent, ToolContext, ToolUseBlock, tool
    from anabranch.testing import FunctionModel

    MARKER = Path(os.environ["APPROVAL_MARKER"])
    LOG = Path(os.environ["APPROVAL_LOG"])

    @tool(needs_approval=True)
    def wire_money(amount: int) -> str:
        \"\"\"Send money.\"\"\"
        with LOG.open("a") as log:
            log.write(f"wired {amount}\\n")
        return f"wired {amount}"

    @tool
    def slow_check(ctx: ToolContext) -> str:
        \"\"\"A check that hangs the first time, after the approval request is committed.\"\"\"
        if not MARKER.exists():
            MARKER.write_text(ctx.session_id)
            time.sleep(600)
        return "check ok"

    def answer(request):
        results = [b for m in request.messages for b in m.tool_results]
        if not results:
            return [
                ToolUseBlock(id="toolu_wire", name="wire_money", input={"amount": 500}),
                ToolUseBlock(id="toolu_check", name="slow_check", input={}),
            ]
        return "done: " + " | ".join(("ERR " if r.is_error else "") + r.content for r in results)

    OFFLINE_MODEL = FunctionModel(answer)
    banker = Agent(name="banker", model="m", tools=[wire_money, slow_check])
    """
)


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    env["APPROVAL_MARKER"] = str(tmp_path / "marker")
    env["APPROVAL_LOG"] = str(tmp_path / "wired.log")
    return env


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "anabranch", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(tmp_path),
    )


def test_an_approval_survives_kill_9_then_is_answered_and_resumed(tmp_path: Path) -> None:
    agent = tmp_path / "bank.py"
    agent.write_text(AGENT_FILE)
    db = tmp_path / "bank.db"
    marker = tmp_path / "marker"
    process = subprocess.Popen(
        [sys.executable, "-m", "anabranch", "run", f"{agent}:banker", "pay", "--offline"]
        + ["--db", str(db), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path),
    )
    # the approval request is committed before any call of the turn runs
    kill_9_once_marked(process, marker, "its tools")
    session_id = marker.read_text()
    listed = _cli(tmp_path, "approve", session_id, "--db", str(db))
    assert listed.returncode == 0, listed.stderr
    assert "toolu_wire  wire_money" in listed.stdout and '"amount": 500' in listed.stdout
    # resuming before the answer: the check runs again, and the session waits (exit 3)
    waiting = _cli(tmp_path, "resume", session_id, "--offline", "--db", str(db), "--quiet")
    assert waiting.returncode == 3, waiting.stderr
    assert f"anabranch approve {session_id} CALL_ID" in waiting.stderr
    assert "wire_money (call toolu_wire" in waiting.stderr
    assert not (tmp_path / "wired.log").exists()
    sessions = _cli(tmp_path, "sessions", "--json", "--db", str(db))
    assert '"status": "waiting"' in sessions.stdout
    approved = _cli(tmp_path, "approve", session_id, "toolu_wire", "--db", str(db))
    assert approved.returncode == 0, approved.stderr
    assert "approved wire_money call toolu_wire" in approved.stdout
    done = _cli(tmp_path, "resume", session_id, "--offline", "--db", str(db), "--quiet")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done: wired 500 | check ok"
    assert (tmp_path / "wired.log").read_text() == "wired 500\n"  # exactly once


def test_a_denial_from_the_cli_reaches_the_model(tmp_path: Path) -> None:
    agent = tmp_path / "bank.py"
    agent.write_text(AGENT_FILE)
    (tmp_path / "marker").write_text("already checked")  # the check does not hang here
    db = tmp_path / "deny.db"
    first = _cli(tmp_path, "run", f"{agent}:banker", "pay", "--offline", "--db", str(db))
    assert first.returncode == 3, first.stderr
    session_id = first.stderr.split("session ", 1)[1].split()[0]
    denied = _cli(
        tmp_path, "approve", session_id, "toolu_wire", "--deny", "over the limit", "--db", str(db)
    )
    assert denied.returncode == 0 and "denied wire_money" in denied.stdout
    done = _cli(tmp_path, "resume", session_id, "--offline", "--db", str(db), "--quiet")
    assert done.returncode == 0, done.stderr
    assert "ERR The user denied this tool call" in done.stdout
    assert "over the limit" in done.stdout and "check ok" in done.stdout
    unknown = anabranch("approve", session_id, "toolu_nope", "--db", str(db))
    assert unknown.returncode == 1 and "no tool call 'toolu_nope'" in unknown.stderr
