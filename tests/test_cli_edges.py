"""The command line's edges, run as a user runs it (real subprocesses, each with a deadline):
every failure is one line, nothing is saved where it cannot be kept, and ``resume`` never
runs code the user did not choose."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from .test_cli import EXAMPLE, ROOT, anabranch

AGENT = f"{EXAMPLE}:supervisor"


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The one error line (stderr may also hold the session id and progress lines)."""
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("anabranch:")]
    assert len(lines) == 1 and lines[0].startswith("anabranch: error: "), done.stderr
    return lines[0]


@pytest.mark.parametrize("db", [":memory:", "file:runs.db?mode=rwc", "file::memory:"])
def test_memory_and_uris_are_refused_and_leave_no_file(tmp_path: Path, db: str) -> None:
    """Before: a session id, exit 0, nothing saved, a 0-byte file named ':memory:'."""
    done = anabranch("run", AGENT, "task", "--offline", "--db", db, cwd=tmp_path)
    assert "is not a file path" in one_line_error(done)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_api_key_fails_before_any_session_or_file(tmp_path: Path) -> None:
    """Before: an SDK TypeError traceback and an empty interrupted session left behind."""
    db = tmp_path / "runs.db"
    done = anabranch("run", AGENT, "task", "--db", str(db))
    assert "ANTHROPIC_API_KEY" in one_line_error(done)
    assert not db.exists()


def _malformed(tmp_path: Path) -> Path:
    db = tmp_path / "old.db"
    made = anabranch("run", AGENT, "task", "--offline", "--db", str(db))
    assert made.returncode == 0, made.stderr
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE meta SET value = 'v5x' WHERE key = 'schema_version'")
    return db


@pytest.mark.parametrize(
    "case", ["dev-null", "proc", "directory", "malformed-version", "missing-dir"]
)
def test_bad_database_paths_are_one_line(tmp_path: Path, case: str) -> None:
    paths: dict[str, Callable[[], str]] = {
        "dev-null": lambda: "/dev/null",
        "proc": lambda: "/proc/self/no/such.db",
        "directory": lambda: str(tmp_path),
        "malformed-version": lambda: str(_malformed(tmp_path)),
        "missing-dir": lambda: str(tmp_path / "absent" / "runs.db"),
    }
    db = paths[case]()
    for args in (("sessions",), ("run", AGENT, "task", "--offline")):
        done = anabranch(*args, "--db", db)
        assert "Traceback" not in done.stderr
        one_line_error(done)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_an_unwritable_directory_is_one_line(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    done = anabranch("run", AGENT, "task", "--offline", "--db", str(locked / "runs.db"))
    one_line_error(done)


BUGGY_MODEL = textwrap.dedent(
    """
    from anabranch import Agent

    class Buggy:
        async def request(self, request):
            raise RuntimeError("a bug in my model client")

        async def count_tokens(self, request):
            return 0

    OFFLINE_MODEL = Buggy()
    agent = Agent(name="plain", instructions="Answer.")
    """
)


def test_an_error_is_one_line_and_debug_shows_its_traceback(tmp_path: Path) -> None:
    source = tmp_path / "buggy.py"
    source.write_text(BUGGY_MODEL)
    args = ("run", f"{source}:agent", "go", "--offline", "--db", str(tmp_path / "b.db"))
    plain = anabranch(*args)
    assert "a bug in my model client" in one_line_error(plain)
    debug = anabranch(*args, "--debug")
    assert "Traceback" in debug.stderr and debug.returncode == 1
    env = anabranch(*args, env={"ANABRANCH_DEBUG": "1"})
    assert "Traceback" in env.stderr


def test_non_utf8_tasks_are_one_line(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    argument = anabranch("run", AGENT, b"caf\xe9 task", "--offline", "--db", str(db))
    assert "not valid UTF-8 (byte 0xe9 at offset 3)" in one_line_error(argument)
    task_file = tmp_path / "task.txt"
    task_file.write_bytes(b"\xff\xfe")
    from_file = anabranch("run", AGENT, "--task-file", str(task_file), "--offline", "--db", str(db))
    assert "not valid UTF-8" in one_line_error(from_file)
    assert not db.exists()


def test_a_closed_stdout_is_a_quiet_exit(tmp_path: Path) -> None:
    """``anabranch show ID | head``: before, a BrokenPipeError traceback."""
    db = tmp_path / "runs.db"
    made = anabranch("run", AGENT, "task", "--offline", "--db", str(db))
    session_id = made.stderr.split()[1]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "anabranch", "show", session_id, "--db", str(db), "--calls"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141 and done.stderr == ""


def test_version() -> None:
    done = anabranch("--version")
    assert done.returncode == 0 and re.fullmatch(r"anabranch \d+\.\d+\.\d+\S*\n", done.stdout)


def test_a_long_task_from_stdin_and_from_a_file(tmp_path: Path) -> None:
    """Over 128 KiB cannot be an argument (the OS refuses it): stdin and --task-file can."""
    db = tmp_path / "runs.db"
    task = "compare " + "é" * 150_000
    from_stdin = anabranch("run", AGENT, "-", "--offline", "--db", str(db), stdin=task)
    assert from_stdin.returncode == 0, from_stdin.stderr
    path = tmp_path / "task.txt"
    path.write_text(task, encoding="utf-8")
    from_file = anabranch("run", AGENT, "--task-file", str(path), "--offline", "--db", str(db))
    assert from_file.returncode == 0, from_file.stderr
    with sqlite3.connect(db) as conn:
        tasks = [row[0] for row in conn.execute("SELECT task FROM sessions")]
    assert tasks == [task, task]


def test_model_and_max_turns_overrides_are_kept_on_resume(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    done = anabranch(
        "run", AGENT, "task", "--offline", "--db", str(db), "--model", "my-model",
        "--max-turns", "7",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(db) as conn:
        models = {row[0] for row in conn.execute("SELECT model FROM runs WHERE depth = 0")}
    assert models == {"my-model"}
    bad = anabranch("run", AGENT, "task", "--offline", "--db", str(db), "--max-turns", "0")
    assert "--max-turns" in one_line_error(bad)


def test_a_module_reference(tmp_path: Path) -> None:
    (tmp_path / "my_agents.py").write_text(
        "from anabranch import Agent\nhelper = Agent(name='helper', instructions='Help.')\n"
    )
    done = anabranch("run", "my_agents:helper", "hello", "--offline", "--db", "r.db", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Report on: hello" in done.stdout
    missing = anabranch("run", "no_such_mod:helper", "x", "--offline", "--db", "r.db", cwd=tmp_path)
    assert "no Python file or module named 'no_such_mod'" in one_line_error(missing)


BLOCKING = textwrap.dedent(
    '''
    from pathlib import Path

    import anyio

    from anabranch import Agent, tool

    GATE = Path(__file__).with_name("gate")

    @tool
    async def wait_for_gate() -> str:
        """Waits until the gate file exists."""
        print("tool started", flush=True)
        while not GATE.exists():
            await anyio.sleep(0.05)
        return "through the gate"

    agent = Agent(name="gated", instructions="Wait.", tools=[wait_for_gate])
    '''
)


def _interrupted_session(tmp_path: Path) -> tuple[Path, Path, str, str]:
    """A session stopped with Ctrl-C while its tool waits: (file, db, id, stderr)."""
    source = tmp_path / "gated.py"
    source.write_text(BLOCKING)
    db = tmp_path / "runs.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    process = subprocess.Popen(
        [sys.executable, "-m", "anabranch", "run", f"{source}:agent", "go", "--offline",
         "--db", str(db)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        line = process.stdout.readline()  # blocks until the tool runs (or the process ends)
        assert line == "tool started\n" and time.monotonic() < deadline
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    assert process.returncode == 130, stderr
    session_id = re.search(r"session (ses_\w+)", stderr)
    assert session_id, stderr
    return source, db, session_id.group(1), stderr


def test_ctrl_c_names_the_session_and_the_database(tmp_path: Path) -> None:
    """Before: 'resume with: anabranch resume <ID>' and no --db."""
    _, db, session_id, stderr = _interrupted_session(tmp_path)
    assert f"resume with: anabranch resume {session_id} --db {db}" in stderr
    assert "<ID>" not in stderr
    listed = anabranch("sessions", "--db", str(db))
    shown = anabranch("show", session_id, "--db", str(db))
    assert re.search(rf"{session_id}\s+interrupted", listed.stdout), listed.stdout
    assert "status=interrupted" in shown.stdout, shown.stdout


def test_resume_runs_the_recorded_file_only_while_it_is_unchanged(tmp_path: Path) -> None:
    """Before: resume imported whatever file the database named."""
    source, db, session_id, _ = _interrupted_session(tmp_path)
    original = source.read_text()
    marker = tmp_path / "ran"
    source.write_text(original + f"\nopen({str(marker)!r}, 'w').close()\n")
    changed = anabranch("resume", session_id, "--db", str(db), "--offline")
    assert f"refusing to run {source}:agent: it changed" in one_line_error(changed)
    assert not marker.exists()
    source.write_text(original)  # the same bytes again: trusted
    (tmp_path / "gate").touch()
    resumed = anabranch("resume", session_id, "--db", str(db), "--offline", timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    assert "through the gate" in resumed.stdout


def test_resume_runs_a_definition_named_on_the_command_line(tmp_path: Path) -> None:
    source, db, session_id, _ = _interrupted_session(tmp_path)
    source.write_text(source.read_text() + "\n# edited\n")
    (tmp_path / "gate").touch()
    resumed = anabranch(
        "resume", session_id, f"{source}:agent", "--db", str(db), "--offline", timeout=60
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "through the gate" in resumed.stdout


def test_resuming_a_finished_session_runs_no_file(tmp_path: Path) -> None:
    """Before: ``resume --offline`` imported the recorded file even for a finished session."""
    source = tmp_path / "helper.py"
    source.write_text("from anabranch import Agent\nagent = Agent(name='h', instructions='H.')\n")
    db = tmp_path / "runs.db"
    done = anabranch("run", f"{source}:agent", "hi", "--offline", "--db", str(db))
    assert done.returncode == 0, done.stderr
    marker = tmp_path / "ran"
    source.write_text(source.read_text() + f"open({str(marker)!r}, 'w').close()\n")
    again = anabranch("resume", done.stderr.split()[1], "--db", str(db), "--offline")
    assert again.returncode == 0 and again.stdout == done.stdout, again.stderr
    assert not marker.exists()


def test_a_database_naming_a_file_of_someone_elses_choosing_is_refused(tmp_path: Path) -> None:
    """A database handed over with a source path but no digest of it runs nothing."""
    source, db, session_id, _ = _interrupted_session(tmp_path)
    evil = tmp_path / "evil.py"
    marker = tmp_path / "ran"
    evil.write_text(f"open({str(marker)!r}, 'w').close()\n")
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE sessions SET source = ?, definition = '{}' WHERE id = ?",
            (f"{evil}:agent", session_id),
        )
    refused = anabranch("resume", session_id, "--db", str(db), "--offline")
    assert "recorded no digest" in one_line_error(refused)
    assert not marker.exists()


FAILING_GRAPH = textwrap.dedent(
    """
    from anabranch import Agent, Graph, Task
    from anabranch.testing import TestModel

    class FailsTheResearch:
        def __init__(self):
            self.inner = TestModel()

        async def request(self, request):
            if "Answer at once." in str(request.system):
                raise RuntimeError("the research model broke")
            return await self.inner.request(request)

        async def count_tokens(self, request):
            return await self.inner.count_tokens(request)

    OFFLINE_MODEL = FailsTheResearch()
    quick = Agent(name="quick", instructions="Answer at once.")
    writer = Agent(name="writer", instructions="Write.")
    graph = Graph(
        tasks=[
            Task(id="research", agent=quick, prompt="Research."),
            Task(id="write", agent=writer, prompt="Write.", depends_on=["research"]),
        ]
    )
    """
)


def test_show_labels_a_graphs_unrun_task_as_the_api_does(tmp_path: Path) -> None:
    """Before: ``show`` said ``[not run]`` where ``GraphResult`` says ``failed``."""
    source = tmp_path / "failing.py"
    source.write_text(FAILING_GRAPH)
    db = tmp_path / "g.db"
    done = anabranch("run", f"{source}:graph", "--offline", "--db", str(db))
    assert done.returncode == 1 and "write: not run: dependency 'research' failed" in done.stderr
    session_id = re.search(r"session (ses_\w+)", done.stderr)
    assert session_id
    shown = anabranch("show", session_id.group(1), "--db", str(db))
    assert shown.returncode == 0, shown.stderr
    assert "write: writer [failed: not run, dependency 'research' failed]" in shown.stdout
    assert "status=failed" in shown.stdout


def test_an_offline_sessions_costs_are_labelled_as_a_test_models(tmp_path: Path) -> None:
    """Before: an offline run showed real-dollar costs with no word that they are not."""
    db = tmp_path / "runs.db"
    done = anabranch("run", AGENT, "task", "--offline", "--db", str(db))
    shown = anabranch("show", done.stderr.split()[1], "--db", str(db))
    assert shown.returncode == 0, shown.stderr
    assert "not real dollars" in shown.stdout
    assert all("(test model)" in line for line in shown.stdout.splitlines() if "cost~" in line)
