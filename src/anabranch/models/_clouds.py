"""Claude on Amazon Bedrock and Google Vertex AI through the SDK's own clients.

What differs from the first-party API, and is handled here:

- **Clients.** ``AsyncAnthropicBedrock`` (SigV4 with the AWS credential chain; extra
  ``bedrock``) and ``AsyncAnthropicVertex`` (a Google access token; extra ``vertex``).
- **Model ids.** Bedrock names models ``global.anthropic.claude-sonnet-4-5-20250929-v1:0``
  (a ``global.`` or geographic ``us.``/``eu.``/``jp.``/``apac.`` inference profile), Vertex
  ``claude-sonnet-4-5@20250929``. ``model_ids`` maps the names agents use to them.
- **Channels.** Limits are kept per ``bedrock:<region>`` or ``vertex:<region>/<project>``.
- **Prompt caching.** Bedrock accepts a 1-hour ``ttl`` only from the 4.5 generation on
  (Claude Sonnet 4.5, Haiku 4.5, Opus 4.5 and later); for older models the marker is sent
  with the default 5-minute TTL instead of being refused.
- **Token counting.** Bedrock's SDK client has none; ``count_tokens`` raises ``ModelAPIError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import anthropic

from anabranch.context._pricing import claude_generation

__all__ = [
    "AnyClient",
    "Provider",
    "cloud_channel",
    "cloud_model",
    "make_client",
    "provider_of",
    "supports_1h_cache",
    "without_unsupported_ttl",
]

Provider = Literal["anthropic", "bedrock", "vertex"]


def supports_1h_cache(provider: Provider, model: str) -> bool:
    """Whether ``provider`` accepts ``cache_control.ttl = "1h"`` for ``model``."""
    if provider != "bedrock":
        return True
    found = claude_generation(model)
    return found is not None and found >= (4, 5)


def without_unsupported_ttl(params: dict[str, Any], provider: Provider) -> dict[str, Any]:
    """``params`` with every 1-hour ``ttl`` dropped when ``provider`` refuses it for the
    model (the marker stays: the prefix is still cached, for 5 minutes)."""
    if supports_1h_cache(provider, str(params.get("model", ""))):
        return params

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            control = value.get("cache_control")
            out = {k: strip(v) for k, v in value.items() if k != "cache_control"}
            if isinstance(control, dict):
                out["cache_control"] = {k: v for k, v in control.items() if k != "ttl"}
            return out
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return {k: strip(v) for k, v in params.items()}


AnyClient = (
    anthropic.AsyncAnthropic | anthropic.AsyncAnthropicBedrock | anthropic.AsyncAnthropicVertex
)


def provider_of(client: AnyClient) -> Provider:
    if isinstance(client, anthropic.AsyncAnthropicBedrock):
        return "bedrock"
    if isinstance(client, anthropic.AsyncAnthropicVertex):
        return "vertex"
    return "anthropic"


def cloud_channel(client: AnyClient) -> str | None:
    """``bedrock:<region>`` or ``vertex:<region>/<project>``; ``None`` for the API."""
    if isinstance(client, anthropic.AsyncAnthropicBedrock):
        return f"bedrock:{client.aws_region}"
    if isinstance(client, anthropic.AsyncAnthropicVertex):
        return f"vertex:{client.region}/{client.project_id or '-'}"
    return None


def make_client(
    provider: Provider,
    *,
    api_key: str | None,
    base_url: str | None,
    timeout: float,
    region: str | None,
    project_id: str | None,
) -> AnyClient:
    """The SDK client for ``provider``, its own retries and spans off."""
    if provider == "bedrock":
        return anthropic.AsyncAnthropicBedrock(
            api_key=api_key,
            aws_region=region,
            base_url=base_url,
            timeout=timeout,
            max_retries=0,
            open_telemetry=False,
        )
    if provider == "vertex":
        kwargs: dict[str, Any] = {"region": region} if region else {}
        if project_id:
            kwargs["project_id"] = project_id
        return anthropic.AsyncAnthropicVertex(
            base_url=base_url, timeout=timeout, max_retries=0, open_telemetry=False, **kwargs
        )
    return anthropic.AsyncAnthropic(
        api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0, open_telemetry=False
    )


def cloud_model(model: str, model_ids: Mapping[str, str]) -> str:
    """The id to send for an agent's ``model`` (``model_ids`` maps names to cloud ids)."""
    return model_ids.get(model, model)
