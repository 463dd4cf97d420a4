"""SDK configuration from OTEL_* variables and CLI flags; the OTLP-JSON lines file;
unreachable collectors; the Phoenix state file."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from anabranch.cli import main
from anabranch.cli._tracing import find_phoenix
from anabranch.errors import UserError
from anabranch.traces.configure import TraceSettings, configure, otlp_traces_url
from anabranch.ui import _phoenix as phoenix

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = f"{ROOT / 'examples' / 'research.py'}:supervisor"

OTEL_VARS = (
    "OTEL_SDK_DISABLED",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "PHOENIX_COLLECTOR_ENDPOINT",
    "PHOENIX_PROJECT_NAME",
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spans(path: Path) -> list[dict[str, Any]]:
    spans = []
    for line in path.read_text().splitlines():
        request = json.loads(line)
        (resource_spans,) = request["resourceSpans"]
        (scope_spans,) = resource_spans["scopeSpans"]
        (span,) = scope_spans["spans"]  # exactly one span per line
        span["resource"] = {
            a["key"]: a["value"]["stringValue"] for a in resource_spans["resource"]["attributes"]
        }
        spans.append(span)
    return spans


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: a["value"] for a in span["attributes"]}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://127.0.0.1:6006", "http://127.0.0.1:6006/v1/traces"),
        ("http://collector:4318/", "http://collector:4318/v1/traces"),
        ("https://x.example/otlp", "https://x.example/otlp/v1/traces"),
        ("http://127.0.0.1:6006/v1/traces", "http://127.0.0.1:6006/v1/traces"),
    ],
)
def test_otlp_url_is_a_base_url_unless_it_names_the_traces_path(given: str, expected: str) -> None:
    assert otlp_traces_url(given) == expected


@pytest.mark.parametrize("bad", ["127.0.0.1:4318", "grpc://x:4317", "", "http://"])
def test_bad_otlp_url_is_a_clear_error(bad: str) -> None:
    with pytest.raises(UserError, match="URL"):
        otlp_traces_url(bad)


def test_nothing_configured_means_no_provider() -> None:
    setup = configure()
    assert setup.provider is None and setup.destinations == []


def test_endpoint_variables_turn_otlp_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert configure().destinations == ["OTLP http://collector:4318/v1/traces"]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://other:9999/custom")
    assert configure().destinations == ["OTLP http://other:9999/custom"]  # used verbatim
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert configure().provider is None


def test_sdk_disabled_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    setup = configure(TraceSettings(otlp="http://x:4318", trace_file=tmp_path / "t.jsonl"))
    assert setup.provider is None
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("OTEL_TRACES_EXPORTER", "zipkin", "not supported"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "unsupported OTLP protocol"),
    ],
)
def test_unsupported_settings_are_clear_errors(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=message):
        configure()


def test_resource_defaults_and_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    setup = configure(TraceSettings(trace_file=tmp_path / "a.jsonl"))
    assert setup.provider is not None
    attributes = setup.provider.resource.attributes
    assert attributes["service.name"] == "anabranch"
    assert attributes["openinference.project.name"] == "anabranch"
    setup.shutdown()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-app")
    monkeypatch.setenv("PHOENIX_PROJECT_NAME", "research")
    setup = configure(TraceSettings(trace_file=tmp_path / "b.jsonl"))
    assert setup.provider is not None
    assert setup.provider.resource.attributes["service.name"] == "my-app"
    assert setup.provider.resource.attributes["openinference.project.name"] == "research"
    setup.shutdown()


def test_trace_file_holds_one_otlp_json_span_per_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "spans.jsonl"
    db = tmp_path / "t.db"
    code = main(
        ["run", EXAMPLE, "Compare A and B", "--offline", "--db", str(db), "--trace-file", str(path)]
    )
    assert code == 0
    session_id = capsys.readouterr().err.split("session ")[1].split()[0]
    spans = _spans(path)
    ids = {s["spanId"] for s in spans}
    assert len(ids) == len(spans) >= 3
    (root,) = [s for s in spans if "parentSpanId" not in s]
    assert root["name"] == "invoke_agent supervisor"
    assert {s["traceId"] for s in spans} == {root["traceId"]}
    for span in spans:
        assert len(span["traceId"]) == 32 and len(span["spanId"]) == 16
        assert int(span["traceId"], 16) and int(span["spanId"], 16)  # hex, not base64
        assert span.get("parentSpanId", root["spanId"]) in ids
        assert int(span["endTimeUnixNano"]) >= int(span["startTimeUnixNano"]) > 0
        assert span["kind"] in (1, 3)  # INTERNAL, CLIENT
        assert _attrs(span)["gen_ai.conversation.id"] == {"stringValue": session_id}
        assert span["resource"]["openinference.project.name"] == "anabranch"
    chats = [s for s in spans if s["name"].startswith("chat ")]
    assert chats and all(s["kind"] == 3 for s in chats)
    tokens = _attrs(chats[0])["gen_ai.usage.input_tokens"]
    assert set(tokens) == {"intValue"} and int(tokens["intValue"]) > 0
    assert path.stat().st_mode & 0o077 == 0  # owner-only: spans may hold content


def test_unwritable_trace_file_is_reported_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "t.db"
    bad = tmp_path / "missing" / "spans.jsonl"
    code = main(["run", EXAMPLE, "x", "--offline", "--db", str(db), "--trace-file", str(bad)])
    assert code == 1
    assert "cannot write the trace file" in capsys.readouterr().err
    assert not db.exists()


def test_unreachable_collector_does_not_fail_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    db = tmp_path / "t.db"
    url = f"http://127.0.0.1:{_closed_port()}"
    code = main(["run", EXAMPLE, "Compare A and B", "--offline", "--db", str(db), "--otlp", url])
    out = capsys.readouterr()
    assert code == 0
    assert "Report on: Compare A and B" in out.out
    assert "Traceback" not in out.err


@pytest.mark.anyio
async def test_unreachable_collector_drops_spans_without_raising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from anabranch import Runtime
    from anabranch.runtime._loader import load_object
    from anabranch.testing import TestModel

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    setup = configure(TraceSettings(otlp=f"http://127.0.0.1:{_closed_port()}"))
    agent = load_object(EXAMPLE)
    async with Runtime(
        db=tmp_path / "t.db", model=TestModel(), tracer_provider=setup.provider
    ) as rt:
        result = await rt.run(agent, "Compare A and B")
    assert result.status == "done"
    setup.shutdown()  # flushes: the export fails, is counted, and nothing raises
    assert setup.export_failures >= 1
    assert len(setup.root_trace_ids) == 1


def test_trace_phoenix_without_a_phoenix_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "t.db"
    code = main(["run", EXAMPLE, "x", "--offline", "--db", str(db), "--trace", "phoenix"])
    assert code == 1
    assert "anabranch ui" in capsys.readouterr().err
    assert not db.exists()


def test_trace_phoenix_uses_the_state_file_and_the_env_override(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)  # phoenix"],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"  # it has exec'd
        info = phoenix.PhoenixInfo(
            url="http://127.0.0.1:6123", pid=proc.pid, port=6123, grpc_port=4400, working_dir="/x"
        )
        phoenix.write_state(info)
        setup = configure(TraceSettings(phoenix=find_phoenix()))
        assert setup.destinations == ["Phoenix http://127.0.0.1:6123"]
        setup.shutdown()
        monkeypatch.setenv("PHOENIX_COLLECTOR_ENDPOINT", "http://127.0.0.1:7000")
        setup = configure(TraceSettings(phoenix=find_phoenix()))
        assert setup.destinations == ["Phoenix http://127.0.0.1:7000"]
        setup.shutdown()
    finally:
        proc.kill()
        proc.wait()


def test_stale_state_file_is_ignored_and_removed() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    info = phoenix.PhoenixInfo(
        url="http://127.0.0.1:6123", pid=proc.pid, port=6123, grpc_port=4400, working_dir="/x"
    )
    path = phoenix.write_state(info)
    assert phoenix.read_state() == info
    assert path.stat().st_mode & 0o077 == 0
    assert phoenix.running_phoenix() is None
    assert not path.exists()


def test_free_port_prefers_the_default_but_avoids_a_busy_one() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = int(busy.getsockname()[1])
        port = phoenix.free_port(taken)
        assert port != taken
    assert phoenix.free_port(taken) == taken


def test_ui_without_phoenix_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("ANABRANCH_PHOENIX_ENV", str(tmp_path / "no-env"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no `phoenix` command either
    assert not phoenix.phoenix_available()
    assert main(["ui", "--no-install"]) == 1
    assert "anabranch ui --install" in capsys.readouterr().err
    assert not (tmp_path / "no-env").exists()


def test_otlp_json_encodes_types_events_links_and_status(tmp_path: Path) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

    from anabranch.traces._file_exporter import OTLPJsonLinesExporter

    path = tmp_path / "x.jsonl"
    exporter = OTLPJsonLinesExporter(path)
    provider = TracerProvider(shutdown_on_exit=False)
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider.add_span_processor(SimpleSpanProcessor(exporter))
    earlier = SpanContext(trace_id=0xABC, span_id=0xDEF, is_remote=True, trace_flags=TraceFlags(1))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("outer", links=[Link(earlier, {"why": "resumed"})]) as span:
        span.set_attributes({"b": True, "i": 7, "f": 0.5, "s": "x", "a": ("p", "q")})
        span.add_event("cache_break", {"cause": "tools"})
        span.set_status(Status(StatusCode.ERROR, "boom"))
        with tracer.start_as_current_span("inner"):
            pass
    provider.shutdown()
    inner, outer = _spans(path)
    assert inner["parentSpanId"] == outer["spanId"]
    assert _attrs(outer) == {
        "b": {"boolValue": True},
        "i": {"intValue": "7"},
        "f": {"doubleValue": 0.5},
        "s": {"stringValue": "x"},
        "a": {"arrayValue": {"values": [{"stringValue": "p"}, {"stringValue": "q"}]}},
    }
    (event,) = outer["events"]
    assert event["name"] == "cache_break" and int(event["timeUnixNano"]) > 0
    (link,) = outer["links"]
    assert link["traceId"] == f"{0xABC:032x}" and link["spanId"] == f"{0xDEF:016x}"
    assert outer["status"] == {"code": 2, "message": "boom"}
    assert outer["kind"] == 1  # SPAN_KIND_INTERNAL
