"""A span exporter that appends OTLP-JSON lines to a file: one span per line.

Each line is a complete OTLP ``ExportTraceServiceRequest`` in the protobuf JSON mapping
(hex trace/span ids, integer enums, nanosecond timestamps as strings) holding exactly one
span with its resource and scope. The file can be read line by line (``jq``, CI artifacts)
or replayed to any collector that accepts OTLP/JSON.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import format_span_id, format_trace_id

__all__ = ["OTLPJsonLinesExporter", "span_to_otlp_json"]


def _any_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}  # int64 is a string in the JSON mapping
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bytes):
        return {"stringValue": value.decode("utf-8", "replace")}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": _attributes(value)}}
    if isinstance(value, Sequence):
        return {"arrayValue": {"values": [_any_value(v) for v in value]}}
    return {"stringValue": str(value)}


def _attributes(attributes: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [{"key": k, "value": _any_value(v)} for k, v in (attributes or {}).items()]


def span_to_otlp_json(span: ReadableSpan) -> dict[str, Any]:
    """One span as an OTLP/JSON ``ExportTraceServiceRequest``."""
    context = span.get_span_context()
    assert context is not None
    record: dict[str, Any] = {
        "traceId": format_trace_id(context.trace_id),
        "spanId": format_span_id(context.span_id),
        "name": span.name,
        "kind": span.kind.value + 1,  # the OTLP enum starts with SPAN_KIND_UNSPECIFIED
        "startTimeUnixNano": str(span.start_time or 0),
        "endTimeUnixNano": str(span.end_time or 0),
        "attributes": _attributes(span.attributes),
        "status": {"code": span.status.status_code.value},
    }
    if span.status.description:
        record["status"]["message"] = span.status.description
    if span.parent is not None:
        record["parentSpanId"] = format_span_id(span.parent.span_id)
    if span.events:
        record["events"] = [
            {
                "timeUnixNano": str(e.timestamp),
                "name": e.name,
                "attributes": _attributes(e.attributes),
            }
            for e in span.events
        ]
    if span.links:
        record["links"] = [
            {
                "traceId": format_trace_id(link.context.trace_id),
                "spanId": format_span_id(link.context.span_id),
                "attributes": _attributes(link.attributes),
            }
            for link in span.links
        ]
    scope = span.instrumentation_scope
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes(span.resource.attributes)},
                "scopeSpans": [
                    {
                        "scope": {
                            "name": scope.name if scope else "",
                            "version": (scope.version or "") if scope else "",
                        },
                        "spans": [record],
                    }
                ],
            }
        ]
    }


class OTLPJsonLinesExporter(SpanExporter):
    """Appends each span as one OTLP-JSON line to ``path`` (created owner-only).

    Raises ``OSError`` at construction if the file cannot be opened, so a bad path is
    reported before a run starts rather than lost in a background thread.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._file: IO[str] | None = os.fdopen(fd, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(
            json.dumps(span_to_otlp_json(s), ensure_ascii=False, separators=(",", ":")) + "\n"
            for s in spans
        )
        with self._lock:
            if self._file is None:
                return SpanExportResult.FAILURE
            self._file.write(lines)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
