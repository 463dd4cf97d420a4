"""``CurrentSpan``: a span made current for a ``with`` block, in one object.

What ``start_as_current_span`` does without its two generator layers (a span per model
call and per tool call is on the hot path): start, make current, record an ``Exception``
leaving the block (not a cancellation) with an error status, end. Telemetry never raises
into a run: if the SDK or a span processor fails, the block runs without a span.

A span's attributes go to ``start_span`` when the tracer's sampler is one of the SDK's own,
which hand the attributes they are given back to the span (``ParentBased``, ``ALWAYS_ON``,
``TraceIdRatioBased``): the span is built with them, and a sampler and the processors'
``on_start`` see them. Any other tracer or sampler gets them right after the start, because
the SDK builds a span from the sampler's result: a sampler that does not hand them back
would drop all of them. Either way a span that records nothing gets nothing set, and what
costs something to build (an opted-in capture of message content) is built only for a span
that records.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from contextvars import Token
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

__all__ = [
    "NO_ATTRIBUTES",
    "CurrentSpan",
    "OpenSpan",
    "close_span",
    "links_or_none",
    "record_failure",
    "safe_set",
    "sampler_keeps_attributes",
    "set_all",
    "set_one",
]

_log = logging.getLogger("anabranch.traces._spans")

NO_ATTRIBUTES: Mapping[str, Any] = {}


def set_all(span: Span, attributes: Mapping[str, Any]) -> None:
    """Attributes that hold no ``None`` onto a span the caller knows records, in one call."""
    try:
        span.set_attributes(attributes)
    except Exception:  # pragma: no cover - telemetry must never break a run
        _log.debug("could not set span attributes", exc_info=True)


def set_one(span: Span, key: str, value: Any) -> None:
    """One attribute onto a span the caller knows records (cheaper in the SDK than a
    one-item ``set_attributes``: no mapping to check and copy)."""
    try:
        span.set_attribute(key, value)
    except Exception:  # pragma: no cover - telemetry must never break a run
        _log.debug("could not set a span attribute", exc_info=True)


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


_DELEGATES: tuple[str, ...] = ("_root", "_remote_parent_sampled", "_remote_parent_not_sampled")
_DELEGATES += ("_local_parent_sampled", "_local_parent_not_sampled")  # ParentBased's


def sampler_keeps_attributes(tracer: trace.Tracer) -> bool:
    """Whether spans of ``tracer`` keep the attributes passed to ``start_span``: an SDK
    tracer whose sampler is built only of the SDK's own samplers (the default
    ``ParentBased(ALWAYS_ON)`` is). Anything else (a hand-written sampler, another SDK, a
    proxy for a provider set later) is not known to, and gets its attributes after."""
    sdk = sys.modules.get("opentelemetry.sdk.trace")  # not imported: not the SDK's tracer
    if sdk is None or type(tracer) is not sdk.Tracer:
        return False
    from opentelemetry.sdk.trace import sampling

    keeping = (sampling.StaticSampler, sampling.TraceIdRatioBased)  # hand back what they get
    delegating = (sampling.ParentBased, sampling.ParentBasedTraceIdRatio)

    def keeps(sampler: object) -> bool:
        if type(sampler) in delegating:
            return all(keeps(getattr(sampler, name, None)) for name in _DELEGATES)
        return type(sampler) in keeping

    return keeps(getattr(tracer, "sampler", None))


def links_or_none(links: Sequence[Link]) -> list[Link] | None:
    return list(links) if links else None


class CurrentSpan:
    """One span, current while the ``with`` block runs: what ``start_as_current_span``
    does, in one object instead of two generator layers (a span per model and tool call
    is on the hot path). An ``Exception`` leaving the block is recorded with an error
    status; a cancellation (a ``BaseException``) is not. If the SDK or a span processor
    fails, the block runs without a span (``INVALID_SPAN``).

    ``attributes`` must hold no ``None``. ``at_start`` (the tracer's sampler keeps them,
    see ``sampler_keeps_attributes``): they are passed to ``start_span``; otherwise they
    are set right after it if the span records. What ``more()`` returns (attributes that
    cost something to build, such as captured message content) follows them, only on a
    span that records.
    """

    __slots__ = (
        "_at_start",
        "_attributes",
        "_kind",
        "_links",
        "_more",
        "_name",
        "_span",
        "_token",
        "_tracer",
    )

    def __init__(
        self,
        tracer: trace.Tracer,
        name: str,
        kind: SpanKind,
        attributes: Mapping[str, Any],
        links: list[Link] | None = None,
        more: Callable[[], Mapping[str, Any]] | None = None,
        at_start: bool = False,
    ) -> None:
        self._at_start = at_start
        self._tracer = tracer
        self._name = name
        self._kind = kind
        self._attributes = attributes
        self._links = links
        self._more = more
        self._span: Span | None = None
        self._token: Token[otel_context.Context] | None = None

    def __enter__(self) -> Span:
        span, self._token = self.open()
        self._span = span if self._token is not None else None
        return span

    def open(self) -> OpenSpan:
        """Start the span and make it current, as ``__enter__`` does, and hand back the span
        and its context token for ``close_span`` (this object is not needed after): a
        caller whose block waits long (a model call waits for the model) keeps two values
        it holds anyway, not this object and the ``with`` statement's bound ``__exit__``.
        If the SDK or a span processor fails: ``INVALID_SPAN`` and no token."""
        attributes, more = self._attributes, self._more
        self._attributes, self._more = NO_ATTRIBUTES, None  # not kept alive while the block runs
        try:
            parent = otel_context.get_current()
            if self._at_start:
                span = self._tracer.start_span(
                    self._name, parent, self._kind, attributes, self._links
                )
                attributes = NO_ATTRIBUTES  # the span has them
            else:
                span = self._tracer.start_span(self._name, parent, self._kind, links=self._links)
            token = otel_context.attach(trace.set_span_in_context(span, parent))
        except Exception:
            _log.debug("could not start span %s", self._name, exc_info=True)
            return trace.INVALID_SPAN, None
        if (attributes or more is not None) and span.is_recording():
            if more is not None:
                try:
                    attributes = {**attributes, **more()}
                except Exception:  # content that cannot be encoded: the span goes without it
                    _log.debug("could not build attributes of span %s", self._name, exc_info=True)
            if attributes:
                set_all(span, attributes)
        return span, token

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        span, token = self._span, self._token
        self._span = self._token = None
        if span is not None:
            close_span(span, token, exc)


OpenSpan = tuple[Span, Token[otel_context.Context] | None]
"""A span ``CurrentSpan.open`` started and made current, and its context token (``None``:
no span was started)."""


def close_span(
    span: Span, token: Token[otel_context.Context] | None, exc: BaseException | None
) -> None:
    """End a span ``CurrentSpan.open`` started (what ``__exit__`` does): an ``Exception``
    leaving its block (``exc``; not a cancellation) recorded with an error status, the
    context it replaced current again, the span ended. Nothing for ``token`` ``None``."""
    if token is None:
        return
    if isinstance(exc, Exception):
        record_failure(span, exc)
    try:
        otel_context.detach(token)
        span.end()
    except Exception:
        _log.debug("could not end span %s", getattr(span, "name", ""), exc_info=True)
