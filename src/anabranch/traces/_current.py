"""``CurrentSpan``: a span made current for a ``with`` block, in one object.

What ``start_as_current_span`` does without its two generator layers (a span per model
call and per tool call is on the hot path): start, make current, record an ``Exception``
leaving the block (not a cancellation) with an error status, end. Telemetry never raises
into a run: if the SDK or a span processor fails, the block runs without a span.

A span's attributes are set once, right after it starts, and only when it records: a span
the sampler dropped, or one from a no-op tracer, gets nothing built for it (the message
content of an opted-in capture included). They are set after the start rather than passed
to ``start_span``: the SDK builds a span from the sampler's result, so a sampler that does
not hand the attributes back would drop all of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextvars import Token
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

__all__ = [
    "NO_ATTRIBUTES",
    "CurrentSpan",
    "links_or_none",
    "record_failure",
    "safe_set",
    "set_all",
]

_log = logging.getLogger("anabranch.traces._spans")

NO_ATTRIBUTES: Mapping[str, Any] = {}


def set_all(span: Span, attributes: Mapping[str, Any]) -> None:
    """Attributes that hold no ``None`` onto a span the caller knows records, in one call."""
    try:
        span.set_attributes(attributes)
    except Exception:  # pragma: no cover - telemetry must never break a run
        _log.debug("could not set span attributes", exc_info=True)


def safe_set(span: Span, attributes: Mapping[str, Any]) -> None:
    """Attributes onto a span if it records; ``None`` values are left out."""
    try:
        if span.is_recording():  # nothing to build for a span that records nothing
            span.set_attributes({k: v for k, v in attributes.items() if v is not None})
    except Exception:  # pragma: no cover - telemetry must never break a run
        _log.debug("could not set span attributes", exc_info=True)


def record_failure(span: Span, exc: Exception) -> None:
    """An exception leaving a span: an ``exception`` event and an error status."""
    try:
        if span.is_recording():
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    except Exception:  # pragma: no cover
        _log.debug("could not record a span's exception", exc_info=True)


def links_or_none(links: Sequence[Link]) -> list[Link] | None:
    return list(links) if links else None


class CurrentSpan:
    """One span, current while the ``with`` block runs: what ``start_as_current_span``
    does, in one object instead of two generator layers (a span per model and tool call
    is on the hot path). An ``Exception`` leaving the block is recorded with an error
    status; a cancellation (a ``BaseException``) is not. If the SDK or a span processor
    fails, the block runs without a span (``INVALID_SPAN``).

    ``attributes`` must hold no ``None``; they are set when the span records, together
    with what ``more()`` returns (attributes that cost something to build, such as
    captured message content), so a span that records nothing costs no attribute work.
    """

    __slots__ = ("_attributes", "_kind", "_links", "_more", "_name", "_span", "_token", "_tracer")

    def __init__(
        self,
        tracer: trace.Tracer,
        name: str,
        kind: SpanKind,
        attributes: Mapping[str, Any],
        links: list[Link] | None = None,
        more: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        self._tracer = tracer
        self._name = name
        self._kind = kind
        self._attributes = attributes
        self._links = links
        self._more = more
        self._span: Span | None = None
        self._token: Token[otel_context.Context] | None = None

    def __enter__(self) -> Span:
        try:
            parent = otel_context.get_current()
            span = self._tracer.start_span(self._name, parent, self._kind, links=self._links)
            self._token = otel_context.attach(trace.set_span_in_context(span, parent))
        except Exception:
            _log.debug("could not start span %s", self._name, exc_info=True)
            return trace.INVALID_SPAN
        self._span = span
        attributes, more = self._attributes, self._more
        self._attributes, self._more = NO_ATTRIBUTES, None  # not kept alive while the block runs
        if (attributes or more is not None) and span.is_recording():
            if more is not None:
                try:
                    attributes = {**attributes, **more()}
                except Exception:  # content that cannot be encoded: the span goes without it
                    _log.debug("could not build attributes of span %s", self._name, exc_info=True)
            set_all(span, attributes)
        return span

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        span = self._span
        if span is None:
            return
        self._span = None
        if isinstance(exc, Exception):
            record_failure(span, exc)
        try:
            if self._token is not None:
                otel_context.detach(self._token)
            span.end()
        except Exception:
            _log.debug("could not end span %s", self._name, exc_info=True)
