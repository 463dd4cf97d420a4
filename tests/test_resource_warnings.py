"""An offline run leaks nothing: no unclosed file, socket, client or database (checked
with ResourceWarning turned into an error, as the issue's acceptance command does)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _anabranch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", "error::ResourceWarning", "-X", "dev", "-m", "anabranch", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_offline_run_and_its_resume_print_no_resource_warning(tmp_path: Path) -> None:
    db = str(tmp_path / "x.db")
    run = _anabranch("run", "examples/research.py:supervisor", "x", "--offline", "--db", db)
    assert run.returncode == 0, run.stderr
    for text in (run.stderr, run.stdout):
        assert "ResourceWarning" not in text and "Exception ignored" not in text, text
    session_id = next(
        line.split()[1] for line in run.stderr.splitlines() if line.startswith("session ")
    )
    again = _anabranch("resume", session_id, "--offline", "--db", db)
    assert again.returncode == 0, again.stderr
    assert "ResourceWarning" not in again.stderr and "Exception ignored" not in again.stderr
    assert again.stdout == run.stdout  # a finished session answers from the store
