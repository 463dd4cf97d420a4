"""Tracing: the only package that knows span names and attribute keys (OTel API only).

``configure`` (in ``anabranch.traces.configure``) sets up the OpenTelemetry SDK and
exporters for applications and the CLI; the library itself needs only the API.
"""

from anabranch.traces._current import OpenSpan as OpenSpan
from anabranch.traces._current import close_span as close_span
from anabranch.traces._settings import OpenInference as OpenInference
from anabranch.traces._spans import SpanRef as SpanRef
from anabranch.traces._spans import Tracing as Tracing

__all__ = ["OpenInference", "OpenSpan", "SpanRef", "Tracing", "close_span"]
