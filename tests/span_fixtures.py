"""Tracing fixtures shared by the span tests: an in-memory exporter and an SDK provider
that exports to it as each span ends.

A module of its own, not ``conftest.py``: only the tests that import it load the SDK.
Use with ``from .span_fixtures import span_exporter, span_provider  # noqa: F401``: the
fixtures are named ``exporter`` and ``provider`` (their functions are not, so a test's
parameter of that name does not shadow an import).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

__all__ = ["span_exporter", "span_provider"]


@pytest.fixture(name="exporter")
def span_exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    yield memory
    memory.clear()


@pytest.fixture(name="provider")
def span_provider(exporter: InMemorySpanExporter) -> TracerProvider:
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    return tracer_provider
