"""End to end with the real UI: Phoenix started offline by ``anabranch ui``, an offline
multi-agent session with compactions (``examples/long_task.py``) exported to it by
``anabranch run --trace phoenix``, spans checked through Phoenix's REST API, and a
compaction span's page rendered by headless Chromium.

Phoenix runs from its own environment, created on first use as ``anabranch ui`` does (in
the real data home, so once per machine: a few minutes); the browser part needs Debian's
``chromium``.
The screenshot is written to ``artifacts/phoenix-trace.png`` (a CI artifact).
"""

from __future__ import annotations

import contextlib
import html
import io
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from anabranch.cli import main
from anabranch.ui import _phoenix as phoenix

from .browser import browse as _browse
from .browser import chromium as _chromium
from .browser import png_pixels as _png_pixels

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
EXAMPLE = f"{ROOT / 'examples' / 'long_task.py'}:supervisor"
TASK = "Write a short history of the river survey"
COMPACTION_KEYS = (
    "anabranch.compaction.trigger",
    "anabranch.compaction.strategy",
    "anabranch.compaction.tokens_before",
    "anabranch.compaction.tokens_after",
    "anabranch.compaction.messages_before",
    "anabranch.compaction.messages_after",
    "anabranch.compaction.kept",
    "gen_ai.compaction.trigger",
    "gen_ai.compaction.strategy",
    "gen_ai.compaction.tokens_before",
    "gen_ai.compaction.tokens_after",
)
PROJECT = "anabranch-e2e"


@pytest.fixture(scope="module")
def user_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private data home (state file, Phoenix data) and a project of our own."""
    patch = pytest.MonkeyPatch()
    # Phoenix's own environment stays where `anabranch ui` keeps it (installed once)
    patch.setenv("ANABRANCH_PHOENIX_ENV", str(phoenix.phoenix_env()))
    data = tmp_path_factory.mktemp("data")
    patch.setenv("XDG_DATA_HOME", str(data))
    patch.setenv("PHOENIX_PROJECT_NAME", PROJECT)
    patch.delenv("PHOENIX_COLLECTOR_ENDPOINT", raising=False)
    yield data
    patch.undo()


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _listening_addresses(port: int) -> set[str]:
    """The local addresses with a TCP socket listening on ``port`` (from /proc/net)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                local, state = row.split()[1], row.split()[3]
                address, hex_port = local.split(":")
                if state != "0A" or int(hex_port, 16) != port:
                    continue
                if len(address) == 8 or address[:24] == "0000000000000000FFFF0000":  # IPv4
                    found.add(".".join(str(b) for b in reversed(bytes.fromhex(address[-8:]))))
                else:  # IPv6 (the all-zero address is every interface)
                    found.add("::" if int(address, 16) == 0 else address)
    return found


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def phoenix_server(user_env: Path) -> Iterator[phoenix.PhoenixInfo]:
    """Phoenix started the way users start it: ``anabranch ui`` (here in the background)."""
    port = phoenix.free_port()
    # installs Phoenix into its own environment first if this machine has none yet
    code, out, err = _cli("ui", "--background", "--port", str(port), "--start-timeout", "180")
    try:
        assert code == 0, err
        assert f"Phoenix is running at http://127.0.0.1:{port}" in out
        info = phoenix.running_phoenix()  # the state file `--trace phoenix` reads
        assert info is not None and info.port == port
        assert Path(info.working_dir).is_relative_to(user_env)  # under the user's data dir
        assert _listening_addresses(info.grpc_port) == {"127.0.0.1"}  # never all interfaces
        assert not _importable("phoenix"), "Phoenix leaked into the test environment"
        yield info
    finally:
        code, out, _ = _cli("ui", "--stop")
        assert code == 0 and "stopped Phoenix" in out
        assert phoenix.running_phoenix() is None


def _get(info: phoenix.PhoenixInfo, path: str, **query: str) -> Any:
    url = f"{info.url}{path}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


@dataclass(frozen=True)
class TracedSession:
    session_id: str
    trace_id: str
    trace_link: str
    exported: dict[str, dict[str, Any]]
    """Span id -> span, from the OTLP-JSON lines file written alongside."""
    stored: dict[str, dict[str, Any]]
    """Span id -> span, as Phoenix's REST API returns it."""


@pytest.fixture(scope="module")
def traced_session(
    phoenix_server: phoenix.PhoenixInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TracedSession]:
    tmp = tmp_path_factory.mktemp("session")
    span_file = tmp / "spans.jsonl"
    code, _, err = _cli(
        "run",
        EXAMPLE,
        TASK,
        "--offline",
        "--db",
        str(tmp / "runs.db"),
        "--trace",
        "phoenix",
        "--trace-file",
        str(span_file),
    )
    assert code == 0, err
    session_id = re.search(r"session (ses_\w+)", err).group(1)  # type: ignore[union-attr]
    link = re.search(r"trace: (\S+)", err).group(1)  # type: ignore[union-attr]
    exported = {}
    for line in span_file.read_text().splitlines():
        span = json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        exported[span["spanId"]] = span
    (trace_id,) = {s["traceId"] for s in exported.values()}

    stored: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # ingestion is asynchronous
        try:
            page = _get(
                phoenix_server, f"/v1/projects/{PROJECT}/spans", trace_id=trace_id, limit="1000"
            )
        except urllib.error.HTTPError as exc:  # 404 until the project's first span lands
            if exc.code != 404:
                raise
            time.sleep(0.25)
            continue
        stored = {s["context"]["span_id"]: s for s in page["data"]}
        if set(stored) >= set(exported):
            break
        time.sleep(0.25)
    yield TracedSession(session_id, trace_id, link, exported, stored)


def test_phoenix_has_every_span_with_its_parent_kind_and_attributes(
    traced_session: TracedSession, phoenix_server: phoenix.PhoenixInfo
) -> None:
    session = traced_session
    assert set(session.stored) == set(session.exported)
    kinds = {"invoke_agent": "AGENT", "chat": "LLM", "execute_tool": "TOOL", "compact": "CHAIN"}
    for span_id, span in session.stored.items():
        sent = session.exported[span_id]
        assert span["name"] == sent["name"]
        assert span["parent_id"] == sent.get("parentSpanId")
        assert span["span_kind"] == kinds[span["name"].split(" ")[0]]
        assert span["attributes"]["session.id"] == session.session_id
    agents = [s for s in session.stored.values() if s["span_kind"] == "AGENT"]
    (root,) = [s for s in agents if s["parent_id"] is None]
    assert root["name"] == "invoke_agent supervisor"
    llm = [s for s in session.stored.values() if s["span_kind"] == "LLM"]
    assert llm and all(s["attributes"]["llm.token_count.prompt"] > 0 for s in llm)
    assert all(
        s["attributes"]["gen_ai.usage.input_tokens"] == s["attributes"]["llm.token_count.prompt"]
        for s in llm
    )
    # the OpenInference keys Phoenix shows are derived by Phoenix from the GenAI names:
    # anabranch sends them only with openinference="full"
    for span in session.stored.values():
        sent = _sent_attributes(session.exported[span["context"]["span_id"]])
        stored = span["attributes"]
        assert "session.id" not in sent
        assert stored["session.id"] == sent["gen_ai.conversation.id"]
        if span["span_kind"] == "LLM":
            assert not [k for k in sent if k.startswith("llm.") and "reasoning" not in k]
            assert stored["llm.model_name"] == sent["gen_ai.request.model"]
            assert stored["llm.provider"] == stored["llm.system"] == "anthropic"
            assert stored["llm.token_count.completion"] == sent["gen_ai.usage.output_tokens"]
            assert stored["llm.token_count.total"] == (
                sent["gen_ai.usage.input_tokens"] + sent["gen_ai.usage.output_tokens"]
            )
            read, write = "cache_read", "cache_write"
            prompt_details = "llm.token_count.prompt_details."
            assert stored[prompt_details + read] == sent[f"gen_ai.usage.{read}.input_tokens"]
            assert stored[prompt_details + write] == sent[f"gen_ai.usage.{write}.input_tokens"]
        if span["span_kind"] == "TOOL":
            assert "tool.name" not in sent and "tool.id" not in sent
            assert stored["tool.name"] == sent["gen_ai.tool.name"]
            assert stored["tool.id"] == sent["gen_ai.tool.call.id"]
        if span["span_kind"] in ("LLM", "TOOL", "AGENT"):
            assert "openinference.span.kind" not in sent  # kind from gen_ai.operation.name
    # the session shows up as a Phoenix session, with this trace in it
    stored_session = _get(phoenix_server, f"/v1/sessions/{session.session_id}")["data"]
    assert [t["trace_id"] for t in stored_session["traces"]] == [session.trace_id]
    assert session.trace_link == phoenix_server.trace_url(session.trace_id)


def _sent_attributes(span: dict[str, Any]) -> dict[str, Any]:
    values = {}
    for item in span["attributes"]:
        ((kind, value),) = item["value"].items()
        values[item["key"]] = int(value) if kind == "intValue" else value
    return values


def test_compact_spans_arrive_under_their_agents_with_their_attributes(
    traced_session: TracedSession,
) -> None:
    stored = traced_session.stored
    compacts = [s for s in stored.values() if s["name"].startswith("compact ")]
    agents = {s["name"].removeprefix("compact ") for s in compacts}
    assert agents == {"supervisor", "archivist", "analyst"}  # each compacts at its own window
    for span in compacts:
        attributes = span["attributes"]
        parent = stored[span["parent_id"]]
        assert parent["span_kind"] == "AGENT"
        assert parent["name"] == "invoke_agent " + span["name"].removeprefix("compact ")
        assert parent["attributes"]["gen_ai.agent.id"] == attributes["gen_ai.agent.id"]
        assert span["span_kind"] == "CHAIN"
        sent = _sent_attributes(traced_session.exported[span["context"]["span_id"]])
        for key in COMPACTION_KEYS:
            assert attributes[key] == sent[key], key
        assert (
            attributes["anabranch.compaction.tokens_after"]
            < (attributes["anabranch.compaction.tokens_before"])
        )
        shown_in, shown_out = (
            json.loads(attributes["input.value"]),
            json.loads(attributes["output.value"]),
        )
        assert shown_in["tokens"] == attributes["anabranch.compaction.tokens_before"]
        assert shown_out["tokens"] == attributes["anabranch.compaction.tokens_after"]
        if attributes["anabranch.compaction.strategy"] == "summarize":  # the summarizer's call
            children = [s for s in stored.values() if s["parent_id"] == span["context"]["span_id"]]
            assert [c["span_kind"] for c in children][:1] == ["LLM"]


def test_compaction_span_page_shows_before_and_after(
    traced_session: TracedSession, phoenix_server: phoenix.PhoenixInfo
) -> None:
    binary = _chromium()
    compact = next(
        s
        for s in traced_session.stored.values()
        if s["name"] == "compact archivist"
        and s["attributes"]["anabranch.compaction.strategy"] == "summarize"
    )
    before = compact["attributes"]["anabranch.compaction.tokens_before"]
    after = compact["attributes"]["anabranch.compaction.tokens_after"]
    # the trace view with this compaction span selected
    url = f"{phoenix_server.url}/redirects/spans/{compact['context']['span_id']}"
    page = _browse(binary, url, "--dump-dom")
    text = html.unescape(re.sub(r"<[^>]+>", " ", page.stdout.decode("utf-8", "replace")))
    for shown in ("invoke_agent supervisor", "compact archivist"):
        assert shown in text, f"{shown!r} is not on the trace page"
    assert str(before) in text and str(after) in text, "before/after tokens are not shown"

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "phoenix-trace.png"
    shot.unlink(missing_ok=True)
    _browse(binary, url, f"--screenshot={shot}")
    assert shot.exists(), "chromium wrote no screenshot"
    width, height, pixels = _png_pixels(shot.read_bytes())
    assert (width, height) == (1600, 1000)
    colours = Counter(pixels)
    assert len(colours) > 32, "the screenshot is (nearly) one colour"
    assert colours.most_common(1)[0][1] < 0.95 * len(pixels), "the screenshot is mostly blank"
