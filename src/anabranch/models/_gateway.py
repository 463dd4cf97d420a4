"""Seeing a gateway between us and the API, and saying so once.

A gateway (LiteLLM proxy, Portkey, Helicone, Cloudflare AI Gateway, Kong, Envoy) shows
itself in its response headers. Most retry failed calls on their own, beneath the runtime's
retries; LiteLLM does twice by default. ``GatewayNotice`` logs one warning per channel
(and adds an ``anabranch.gateway`` event to the current span) pointing at how to turn the
gateway's retries off; ``RetryPolicy.gateway_retries`` then keeps the product bounded.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

from anabranch.traces._events import gateway_detected

__all__ = ["GATEWAY_DEFAULT_RETRIES", "GatewayNotice", "detect_gateway", "public_channel"]

log = logging.getLogger("anabranch.models")

_GATEWAY_PREFIXES = (
    ("x-litellm-", "litellm"),
    ("x-portkey-", "portkey"),
    ("helicone-", "helicone"),
    ("cf-aig-", "cloudflare-ai-gateway"),
    ("x-kong-", "kong"),
    ("x-envoy-", "envoy"),
)

GATEWAY_DEFAULT_RETRIES = {"litellm": 2}
"""Retries a gateway makes on its own by default, where documented (LiteLLM: 2)."""

_HOW_TO_TURN_OFF = {
    "litellm": "set `num_retries: 0` under `router_settings` (and `litellm_settings`) of the "
    "proxy's config.yaml",
}


def detect_gateway(headers: Mapping[str, str] | None) -> str | None:
    """The gateway whose headers ``headers`` carries (``"litellm"``, ...), or ``None``."""
    if not headers:
        return None
    for name in headers:
        lowered = name.lower()
        for prefix, gateway in _GATEWAY_PREFIXES:
            if lowered.startswith(prefix):
                return gateway
    return None


class GatewayNotice:
    """Remembers the gateway seen on one channel and announces it the first time."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.gateway: str | None = None

    def seen(self, headers: Mapping[str, str] | None) -> str | None:
        """The gateway in ``headers`` (announced if it is the first one seen), or ``None``."""
        gateway = detect_gateway(headers)
        if gateway is None or gateway == self.gateway:
            return gateway
        self.gateway = gateway
        version = (headers or {}).get(f"x-{gateway}-version")
        how = _HOW_TO_TURN_OFF.get(gateway, "turn its retries off in its configuration")
        log.warning(
            "model calls to %s go through a %s gateway%s; it may retry failed calls beneath "
            "anabranch's own retries: %s, then pass RetryPolicy(gateway_retries=0)",
            self.channel,
            gateway,
            f" (version {version})" if version else "",
            how,
        )
        gateway_detected(gateway=gateway, channel=self.channel, version=version)
        return gateway


def public_channel(url: str) -> str:
    """``url`` without user info, query or fragment, and without a trailing slash."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))
