"""OpenTelemetry SDK setup for applications and the CLI (the library uses only the API).

``configure`` builds a ``TracerProvider`` from the standard ``OTEL_*`` variables plus
explicit destinations (an OTLP/HTTP URL, an OTLP-JSON lines file, a Phoenix). Finding the
Phoenix that ``anabranch ui`` started, and the command-line flags, belong to the CLI
(``anabranch.cli._tracing``).
Every exporter sits behind a ``BatchSpanProcessor`` (export happens on a background
thread) and a guard that swallows its errors, so a slow or unreachable collector never
fails or slows a run; ``TraceSetup.shutdown`` bounds the final flush.

Honoured variables: ``OTEL_SDK_DISABLED``, ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, ``none``),
``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` (the plain one is a base URL that gets
``/v1/traces``; the ``TRACES`` one is used verbatim), ``..._PROTOCOL`` (``http/protobuf``;
``grpc`` if its exporter is installed), ``..._HEADERS``, ``..._TIMEOUT``, ``OTEL_BSP_*``,
``OTEL_TRACES_SAMPLER(_ARG)``. Setting an OTLP endpoint without ``OTEL_TRACES_EXPORTER``
turns OTLP export on.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)

from anabranch._version import VERSION
from anabranch.errors import UserError
from anabranch.traces._file_exporter import OTLPJsonLinesExporter

__all__ = [
    "PhoenixEndpoint",
    "TraceSettings",
    "TraceSetup",
    "configure",
    "otlp_traces_url",
    "phoenix_from_env",
]

_log = logging.getLogger("anabranch.traces")
DEFAULT_OTLP_TIMEOUT = 5.0
"""Seconds per export (retries included) unless ``OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT``."""
DEFAULT_PROJECT = "anabranch"


@dataclass(frozen=True)
class PhoenixEndpoint:
    """Where a Phoenix collects spans (OTLP/HTTP) and shows them (its UI)."""

    otlp_url: str
    ui_url: str

    @classmethod
    def from_collector(cls, endpoint: str) -> PhoenixEndpoint:
        """The Phoenix behind a collector URL (``PHOENIX_COLLECTOR_ENDPOINT``'s form)."""
        url = otlp_traces_url(endpoint)
        return cls(url, url[: -len("/v1/traces")])


def phoenix_from_env() -> PhoenixEndpoint | None:
    """The Phoenix ``PHOENIX_COLLECTOR_ENDPOINT`` names, if set."""
    endpoint = _env("PHOENIX_COLLECTOR_ENDPOINT")
    return PhoenixEndpoint.from_collector(endpoint) if endpoint else None


@dataclass(frozen=True)
class TraceSettings:
    """Where spans go, beyond what the ``OTEL_*`` variables say.

    Attributes:
        otlp: an OTLP/HTTP (protobuf) URL; a base URL gets ``/v1/traces`` appended.
        trace_file: append every span as one OTLP-JSON line to this file.
        phoenix: send to this Phoenix (``phoenix_endpoint`` finds the one of
            ``PHOENIX_COLLECTOR_ENDPOINT``).
        service_name: ``service.name`` unless ``OTEL_SERVICE_NAME`` says otherwise.
        project: Phoenix project (resource ``openinference.project.name``); default
            ``$PHOENIX_PROJECT_NAME`` or ``anabranch``.
    """

    otlp: str | None = None
    trace_file: Path | None = None
    phoenix: PhoenixEndpoint | None = None
    service_name: str = "anabranch"
    project: str | None = None


@dataclass
class _Destination:
    label: str
    exporter: SpanExporter
    ui_url: str | None = None
    """Base URL of a Phoenix UI that shows these spans."""


class _GuardedExporter(SpanExporter):
    """Never raises; reports the first failure once as a warning and then stays quiet."""

    def __init__(self, inner: SpanExporter, label: str) -> None:
        self._inner = inner
        self._label = label
        self._warned = False
        self.failures = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception:
            _log.debug("exporter %s raised", self._label, exc_info=True)
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self.failures += 1
            if not self._warned:
                self._warned = True
                _log.warning(
                    "anabranch: could not export spans to %s (the run is not affected; "
                    "later failures are not reported)",
                    self._label,
                )
        return result

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        try:
            return bool(self._inner.force_flush(timeout_millis))
        except Exception:
            return False

    def shutdown(self) -> None:
        try:
            self._inner.shutdown()
        except Exception:
            _log.debug("exporter %s failed to shut down", self._label, exc_info=True)


class _RootSpans(SpanProcessor):
    """Remembers the trace id of every root span (one per session run or resume)."""

    def __init__(self) -> None:
        self.trace_ids: list[str] = []
        self._lock = threading.Lock()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if span.parent is None and span.context is not None:
            with self._lock:
                self.trace_ids.append(trace.format_trace_id(span.context.trace_id))

    def on_end(self, span: ReadableSpan) -> None:
        return None


@dataclass
class TraceSetup:
    """A configured provider (None when tracing is off) and its destinations."""

    provider: TracerProvider | None = None
    destinations: list[str] = field(default_factory=list)
    ui_url: str | None = None
    _roots: _RootSpans = field(default_factory=_RootSpans)
    _guards: list[_GuardedExporter] = field(default_factory=list)
    _done: bool = False

    @property
    def export_failures(self) -> int:
        """How many span batches could not be exported (they were dropped)."""
        return sum(g.failures for g in self._guards)

    @property
    def root_trace_ids(self) -> list[str]:
        """Hex ids of the traces started so far (a session's run, or its resume)."""
        return list(self._roots.trace_ids)

    def trace_links(self) -> list[str]:
        """Links that open each trace in the Phoenix UI (empty when not sending there)."""
        if self.ui_url is None:
            return []
        return [f"{self.ui_url}/redirects/traces/{t}" for t in self.root_trace_ids]

    def shutdown(self, timeout: float = DEFAULT_OTLP_TIMEOUT) -> bool:
        """Flush and close the exporters, waiting at most ``timeout`` seconds.

        Returns False if they did not finish in time (their spans may be lost).
        """
        if self.provider is None or self._done:
            return True
        self._done = True
        provider = self.provider
        finished = threading.Event()

        def run() -> None:
            try:
                provider.shutdown()
            except Exception:
                _log.debug("tracer provider shutdown failed", exc_info=True)
            finally:
                finished.set()

        threading.Thread(target=run, name="anabranch-trace-shutdown", daemon=True).start()
        if finished.wait(timeout):
            return True
        _log.warning("anabranch: spans were not all exported within %.0f s", timeout)
        return False


def otlp_traces_url(url: str) -> str:
    """The OTLP/HTTP traces endpoint for ``url``: kept if it ends in ``/v1/traces``,
    otherwise treated as a base URL (like ``OTEL_EXPORTER_OTLP_ENDPOINT``)."""
    parsed = urllib.parse.urlsplit(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UserError(f"not an http(s) URL for OTLP: {url!r}")
    if parsed.path.rstrip("/").endswith("/v1/traces"):
        return url.strip()
    return urllib.parse.urlunsplit(parsed._replace(path=parsed.path.rstrip("/") + "/v1/traces"))


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def _env_otlp_endpoint() -> str:
    explicit = _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if explicit:
        return explicit
    base = _env("OTEL_EXPORTER_OTLP_ENDPOINT")
    if base:
        return otlp_traces_url(base)
    return "http://localhost:4318/v1/traces"


def _otlp_timeout() -> float | None:
    if _env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or _env("OTEL_EXPORTER_OTLP_TIMEOUT"):
        return None  # the exporter reads them itself
    return DEFAULT_OTLP_TIMEOUT


def _http_exporter(endpoint: str) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint, timeout=_otlp_timeout())


def _env_otlp_exporter() -> _Destination:
    protocol = (
        _env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or _env("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).lower()
    if protocol == "http/protobuf":
        endpoint = _env_otlp_endpoint()
        return _Destination(f"OTLP {endpoint}", _http_exporter(endpoint))
    if protocol == "grpc":
        try:
            module: Any = importlib.import_module(
                "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"
            )
        except ImportError as exc:
            raise UserError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc; "
                "install it or use http/protobuf"
            ) from exc
        exporter: SpanExporter = module.OTLPSpanExporter(timeout=_otlp_timeout())
        return _Destination("OTLP/gRPC", exporter)
    raise UserError(
        f"unsupported OTLP protocol {protocol!r}: use http/protobuf or grpc "
        "(for OTLP-JSON, write a file with --trace-file)"
    )


def _env_destinations() -> list[_Destination]:
    names = [n.strip().lower() for n in _env("OTEL_TRACES_EXPORTER").split(",") if n.strip()]
    if not names:
        wants_otlp = bool(
            _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or _env("OTEL_EXPORTER_OTLP_ENDPOINT")
        )
        names = ["otlp"] if wants_otlp else []
    destinations = []
    for name in names:
        if name == "none":
            continue
        if name == "otlp":
            destinations.append(_env_otlp_exporter())
        elif name == "console":
            destinations.append(_Destination("console", ConsoleSpanExporter(out=sys.stderr)))
        else:
            raise UserError(
                f"OTEL_TRACES_EXPORTER={name!r} is not supported (use otlp, console or none)"
            )
    return destinations


def _resource(settings: TraceSettings) -> Resource:
    defaults = Resource(
        {
            "service.name": settings.service_name,
            "service.version": VERSION,
            "openinference.project.name": settings.project
            or _env("PHOENIX_PROJECT_NAME")
            or DEFAULT_PROJECT,
        }
    )
    # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win over our defaults.
    return Resource.create({}).merge(defaults).merge(OTELResourceDetector().detect())


def configure(
    settings: TraceSettings | None = None,
    *,
    set_global: bool = False,
    quiet_exporter_logs: bool = True,
) -> TraceSetup:
    """Build a tracer provider for ``settings`` and the ``OTEL_*`` variables.

    Returns a setup whose ``provider`` is None when no destination is configured or
    ``OTEL_SDK_DISABLED=true``. Pass ``setup.provider`` to ``Runtime(tracer_provider=...)``
    (or use ``set_global``) and call ``setup.shutdown()`` before the process exits.

    Args:
        quiet_exporter_logs: hide the OTLP exporter's own retry/failure log lines; a
            single warning from anabranch reports an unreachable destination instead.

    Raises:
        UserError: an unsupported exporter/protocol, a bad URL, or an unwritable trace file.
    """
    settings = settings or TraceSettings()
    if _env("OTEL_SDK_DISABLED").lower() == "true":
        return TraceSetup()
    destinations = _env_destinations()
    if settings.otlp:
        url = otlp_traces_url(settings.otlp)
        destinations.append(_Destination(f"OTLP {url}", _http_exporter(url)))
    if settings.phoenix is not None:
        ui = settings.phoenix.ui_url
        exporter = _http_exporter(settings.phoenix.otlp_url)
        destinations.append(_Destination(f"Phoenix {ui}", exporter, ui_url=ui))
    if settings.trace_file is not None:
        try:
            exporter = OTLPJsonLinesExporter(settings.trace_file)
        except OSError as exc:
            raise UserError(f"cannot write the trace file {settings.trace_file}: {exc}") from exc
        destinations.append(_Destination(f"file {settings.trace_file}", exporter))
    if not destinations:
        return TraceSetup()
    if quiet_exporter_logs:
        logging.getLogger("opentelemetry.exporter.otlp").setLevel(logging.CRITICAL)
    provider = TracerProvider(resource=_resource(settings), shutdown_on_exit=False)
    setup = TraceSetup(provider=provider)
    provider.add_span_processor(setup._roots)
    for destination in destinations:
        guard = _GuardedExporter(destination.exporter, destination.label)
        setup._guards.append(guard)
        provider.add_span_processor(BatchSpanProcessor(guard))
        setup.destinations.append(destination.label)
        setup.ui_url = setup.ui_url or destination.ui_url
    if set_global:
        trace.set_tracer_provider(provider)
    return setup
