"""Looking into a compacting multi-agent session from the CLI: ``show --messages``, the
``--json`` outputs, and the HTML report rendered by headless Chromium."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from anabranch.cli._html_report import CONTEXT_COLOUR

from .browser import browse, chromium, png_pixels
from .test_cli import ROOT, anabranch

ARTIFACTS = ROOT / "artifacts"


@pytest.fixture(scope="module")
def long_session(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    db = tmp_path_factory.mktemp("inspect") / "long.db"
    done = anabranch(
        "run", "examples/long_task.py:supervisor", "Audit the archive", "--offline", "--db", str(db)
    )
    assert done.returncode == 0, done.stderr
    match = re.search(r"session (ses_[0-9a-f]+)", done.stderr)
    assert match, done.stderr
    return db, match.group(1)


def _json(*args: str) -> object:
    done = anabranch(*args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_show_json_holds_the_tree_with_per_agent_and_rolled_up_accounting(
    long_session: tuple[Path, str],
) -> None:
    db, session_id = long_session
    view = _json("show", session_id, "--json", "--db", str(db))
    assert isinstance(view, dict) and view["schema_version"] == 1 and view["id"] == session_id
    (root,) = view["runs"]
    assert root["agent"] == "supervisor" and root["children"]
    assert root["window"] == 4000 and root["threshold"] is not None
    children_cost = sum(c["rolled_up"]["cost"] for c in root["children"])
    assert root["rolled_up"]["cost"] == pytest.approx(root["cost"] + children_cost)
    assert root["rolled_up"]["runs"] == 1 + sum(c["rolled_up"]["runs"] for c in root["children"])
    total_in = root["rolled_up"]["usage"]["input_tokens"]
    assert total_in == root["usage"]["input_tokens"] + sum(
        c["rolled_up"]["usage"]["input_tokens"] for c in root["children"]
    )
    archivist = next(c for c in root["children"] if c["agent"] == "archivist")
    assert archivist["compactions"] >= 1 and archivist["calls"]
    assert all(call["context_tokens"] > 0 for call in archivist["calls"])
    assert view["compactions"]
    assert {"kind", "tokens_before", "details"} <= set(view["compactions"][0])


def test_sessions_and_compactions_json(long_session: tuple[Path, str]) -> None:
    db, session_id = long_session
    sessions = _json("sessions", "--json", "--db", str(db))
    assert isinstance(sessions, list) and sessions[0]["id"] == session_id
    assert sessions[0]["status"] == "done" and sessions[0]["agents"] >= 3
    compactions = _json("compactions", session_id, "--json", "--db", str(db))
    assert isinstance(compactions, list) and len(compactions) >= 5
    ok = [c for c in compactions if c["kind"] == "compaction" and c["status"] == "ok"]
    assert ok and all(c["tokens_after"] < c["tokens_before"] for c in ok)
    assert {c["agent"] for c in compactions} >= {"archivist", "analyst"}


def test_show_messages_marks_compaction_boundaries(long_session: tuple[Path, str]) -> None:
    db, session_id = long_session
    view = _json("show", session_id, "--json", "--db", str(db))
    assert isinstance(view, dict)
    archivist = next(c for c in view["runs"][0]["children"] if c["agent"] == "archivist")
    shown = anabranch("show", session_id, "--messages", archivist["id"], "--db", str(db))
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert text.count("════ compaction") == archivist["compactions"]
    assert "--- #0 user ---" in text and "(turn 1)" in text
    assert "from here the model was shown" in text
    assert "chars)" in text  # long tool payloads are abbreviated
    transcript = _json("show", session_id, "--messages", archivist["id"], "--json", "--db", str(db))
    assert isinstance(transcript, dict) and transcript["run_id"] == archivist["id"]
    kinds = [e["kind"] for e in transcript["entries"]]
    assert kinds.count("boundary") >= archivist["compactions"]
    # the root run is the default
    root = anabranch("show", session_id, "--messages", "--db", str(db))
    assert root.returncode == 0 and f"run {view['runs'][0]['id']} (supervisor" in root.stdout
    bad = anabranch("show", session_id, "--messages", "run_nope", "--db", str(db))
    assert bad.returncode == 1 and "no run 'run_nope'" in bad.stderr


def _context_points(dom: str, run_id: str) -> list[float]:
    pattern = rf"<svg[^>]*class=\"context-plot\"[^>]*data-run=\"{run_id}\".*?</svg>"
    svg = re.search(pattern, dom, re.S)
    assert svg, f"no context plot for {run_id}"
    points = re.search(r"class=\"context-line\"[^>]*points=\"([^\"]+)\"", svg.group(0))
    assert points
    return [float(p.split(",")[1]) for p in points.group(1).split()]


def test_the_report_renders_the_sawtooth_in_chromium(
    long_session: tuple[Path, str], tmp_path: Path
) -> None:
    db, session_id = long_session
    out = tmp_path / "report.html"
    done = anabranch("report", session_id, "-o", str(out), "--db", str(db))
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org", "")
    binary = chromium()
    dom = browse(binary, out.as_uri(), "--dump-dom").stdout.decode("utf-8", "replace")
    view = _json("show", session_id, "--json", "--db", str(db))
    assert isinstance(view, dict)
    archivist = next(c for c in view["runs"][0]["children"] if c["agent"] == "archivist")
    ys = _context_points(dom, archivist["id"])  # SVG y grows downwards: a drop is a rise
    drops = sum(1 for a, b in zip(ys, ys[1:], strict=False) if b > a + 5)
    assert drops >= 1, "the archivist's context never drops: no sawtooth"
    assert dom.count('class="compaction-drop"') >= archivist["compactions"]
    for element in ('class="threshold"', 'class="window"', 'class="cache-plot"', "run-row"):
        assert element in dom, element
    assert dom.count("run-row") == view["runs"][0]["rolled_up"]["runs"]
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    browse(binary, out.as_uri(), f"--screenshot={shot}")
    assert shot.exists(), "chromium wrote no screenshot"
    width, height, pixels = png_pixels(shot.read_bytes())
    colours = Counter(pixels)
    assert len(colours) > 16, "the screenshot is (nearly) one colour"
    assert colours.most_common(1)[0][1] < 0.97 * len(pixels), "the screenshot is mostly blank"
    line = bytes.fromhex(CONTEXT_COLOUR[1:])
    assert any(p[:3] == line for p in pixels), "the context line is not on the screenshot"
