"""Span events raised below the runtime (in model clients), on whatever span is current."""

from __future__ import annotations

import logging

from opentelemetry import trace

__all__ = ["gateway_detected"]

_log = logging.getLogger(__name__)


def gateway_detected(*, gateway: str, channel: str, version: str | None) -> None:
    """An ``anabranch.gateway`` event: model calls on ``channel`` go through ``gateway``."""
    attributes = {"anabranch.gateway.name": gateway, "anabranch.gateway.channel": channel}
    if version:
        attributes["anabranch.gateway.version"] = version
    try:
        trace.get_current_span().add_event("anabranch.gateway", attributes)
    except Exception:  # pragma: no cover - telemetry never raises into a run
        _log.debug("could not add the gateway event", exc_info=True)
