"""The code the suite tests also passes the project's static checks (the same commands
the README names), so that CI fails on a type error or a lint finding, not only on a
failing test."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .helpers import installed_tool

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing() -> None:
    done = subprocess.run(
        [installed_tool("ruff"), "check", "--no-cache", "src", "tests", "bench", "examples"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mypy_strict_finds_nothing(tmp_path: Path) -> None:
    """Strict on src/ and tests/ (``[tool.mypy]`` in pyproject.toml), from a cold cache."""
    done = subprocess.run(
        [installed_tool("mypy"), "--cache-dir", str(tmp_path / "mypy-cache")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
