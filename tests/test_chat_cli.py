"""``anabranch chat``: turns from stdin, ``--session`` continues, ``kill -9`` mid-turn resumes."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from .helpers import kill_9_once_marked
from .test_cli import ROOT, anabranch

AGENT_FILE = textwrap.dedent(
    """
    import os, time
    from pathlib import Path
    from anabranch import Agent, ToolContext, ToolUseBlock, tool
    from anabranch.testing import FunctionModel

    MARKER = Path(os.environ["CHAT_MARKER"])

    @tool
    def slow_step(ctx: ToolContext) -> str:
        \"\"\"A step that hangs the first time (so the test can kill the process).\"\"\"
        if not MARKER.exists():
            MARKER.write_text(ctx.session_id)
            time.sleep(600)
        return "step done"

    def answer(request):
        last = request.messages[-1]
        asked = [m.text for m in request.messages if m.role == "user" and m.text]
        if "block" in last.text and not last.tool_results:
            return [ToolUseBlock(id=f"toolu_slow_{len(asked)}", name="slow_step", input={})]
        return f"answer {len(asked)}: {asked[-1]}"

    OFFLINE_MODEL = FunctionModel(answer)
    talker = Agent(name="talker", model="m", tools=[slow_step])
    """
)


def _chat(agent: Path, db: Path, stdin: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    env["CHAT_MARKER"] = str(db.with_suffix(".marker"))
    return subprocess.run(
        [sys.executable, "-m", "anabranch", "chat", f"{agent}:talker", "--offline"]
        + ["--db", str(db), "--quiet", *extra],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_chat_reads_turns_from_stdin_and_continues_by_session(tmp_path: Path) -> None:
    agent = tmp_path / "talk.py"
    agent.write_text(AGENT_FILE)
    db = tmp_path / "chat.db"
    first = _chat(agent, db, "hello\n\nhow are you\n")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == ["answer 1: hello", "answer 2: how are you"]
    session_id = first.stderr.split("session ", 1)[1].split()[0]
    again = _chat(agent, db, "third\n", "--session", session_id)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == ["answer 3: third"]
    listed = anabranch("sessions", "--db", str(db))
    assert listed.stdout.count("ses_") == 1  # one conversation, one session


def test_a_chat_killed_mid_turn_resumes_by_id(tmp_path: Path) -> None:
    agent = tmp_path / "talk.py"
    agent.write_text(AGENT_FILE)
    db = tmp_path / "kill.db"
    marker = db.with_suffix(".marker")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    env["CHAT_MARKER"] = str(marker)
    process = subprocess.Popen(
        [sys.executable, "-m", "anabranch", "chat", f"{agent}:talker", "--offline"]
        + ["--db", str(db), "--quiet"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdin is not None
    process.stdin.write("hello\nplease block now\n")
    process.stdin.flush()
    # the tool of turn 2 runs: everything up to there is committed
    kill_9_once_marked(process, marker, "its second turn")
    session_id = marker.read_text()
    resumed = _chat(agent, db, "and now?\n", "--session", session_id)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines() == [
        "answer 2: please block now",  # the killed turn, finished
        "answer 3: and now?",
    ]


def test_on_a_terminal_the_prompt_shows_the_gauge_and_slash_commands_work(
    tmp_path: Path,
) -> None:

    agent = tmp_path / "talk.py"
    agent.write_text(AGENT_FILE)
    db = tmp_path / "tty.db"
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    env["CHAT_MARKER"] = str(db.with_suffix(".marker"))
    process = subprocess.Popen(
        [sys.executable, "-m", "anabranch", "chat", f"{agent}:talker", "--offline"]
        + ["--db", str(db)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    screen = b""

    def read_until(text: bytes) -> None:
        nonlocal screen
        deadline = time.monotonic() + 60
        while text not in screen:
            assert time.monotonic() < deadline, f"never saw {text!r}: {screen[-400:]!r}"
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                screen += os.read(master, 65536)

    try:
        read_until(b"> ")
        os.write(master, b"hello\n")
        read_until(b"answer 1: hello")
        read_until(b"[context ")  # the gauge before the next prompt
        os.write(master, b"/context\n")
        read_until(b"compactions, run run_")
        os.write(master, b"/cost\n")
        read_until(b"so far; in=")
        os.write(master, b"/compact\n")
        read_until(b"compact")
        os.write(master, b"/nope\n")
        read_until(b"unknown command /nope")
        os.write(master, b"/quit\n")
        process.wait(timeout=30)
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0
    assert re.search(rb"\[context \d+(\.\d+k)? / \d+k\] > ", screen), screen[-600:]
