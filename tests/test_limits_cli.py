"""``--budget`` on ``run`` and ``resume``; ``show`` marks stopped runs and spend against
each budget (a real subprocess, offline)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from anabranch.cli._budget import parse_budget

from .test_cli import EXAMPLE, anabranch


def test_a_budget_stops_a_session_show_marks_it_and_resume_continues_it(tmp_path: Path) -> None:
    db = str(tmp_path / "b.db")
    task = "Compare SQLite and DuckDB"
    ran = anabranch("run", f"{EXAMPLE}:supervisor", task, "--offline", "--db", db, "--budget", "3k")
    assert ran.returncode == 0, ran.stderr
    assert "Report on: Compare SQLite and DuckDB" in ran.stdout  # the answer so far
    match = re.search(r"session (ses_[0-9a-f]+)", ran.stderr)
    assert match and "incomplete: stopped by a limit (budget)" in ran.stderr
    session_id = match.group(1)
    shown = anabranch("show", session_id, "--db", db)
    assert shown.returncode == 0, shown.stderr
    assert "status=incomplete" in shown.stdout
    assert "[incomplete: stopped by the session budget (3,000 tokens)]" in shown.stdout
    assert re.search(r"^budget: session [\d,]+ of 3,000 tokens \(\d+%\)$", shown.stdout, re.M)
    more = anabranch("resume", session_id, "--offline", "--db", db, "--budget", "tokens=1M")
    assert more.returncode == 0, more.stderr
    assert "incomplete" not in more.stderr
    again = anabranch("show", session_id, "--db", db)
    assert "status=done" in again.stdout
    assert re.search(r"^supervisor \[done\]", again.stdout, re.M)
    assert re.search(r"^budget: session [\d,]+ of 1,000,000 tokens", again.stdout, re.M)


def test_budget_specs_are_read_or_refused_in_one_line() -> None:
    assert parse_budget("150k").max_tokens == 150_000
    assert parse_budget("2M").max_tokens == 2_000_000
    assert parse_budget("$5").max_cost_usd == 5.0
    both = parse_budget("tokens=2000000, usd=2.5")
    assert (both.max_tokens, both.max_cost_usd) == (2_000_000, 2.5)
    for bad in ("lots", "usd=cheap", "0", "tokens=-3"):
        with pytest.raises(argparse.ArgumentTypeError, match="budget"):
            parse_budget(bad)
    refused = anabranch("run", f"{EXAMPLE}:supervisor", "t", "--offline", "--budget", "lots")
    assert refused.returncode == 2 and "cannot read budget 'lots'" in refused.stderr
