"""``AnthropicModel``: the official ``anthropic`` SDK (2.x) behind our ``Model`` protocol."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import anthropic
import httpx2

from anabranch.errors import ModelAPIError, ModelConnectionError, UserError
from anabranch.messages import (
    Block,
    CacheTTL,
    Document,
    Image,
    Message,
    ModelRequest,
    ModelResponse,
    ModelSettings,
    RawBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from anabranch.models._base import DeltaSink
from anabranch.models._clouds import (
    AnyClient,
    Provider,
    cloud_channel,
    cloud_model,
    make_client,
    provider_of,
    without_unsupported_ttl,
)
from anabranch.models._compaction_request import compaction_request
from anabranch.models._errors import api_error
from anabranch.models._gateway import GatewayNotice, public_channel
from anabranch.models._provider_limits import saw_headers

__all__ = ["AnthropicModel", "block_param", "request_to_params", "settings_params"]


class AnthropicModel:
    """Streams every call through ``AsyncAnthropic.messages.stream``.

    The key comes from ``api_key`` or ``ANTHROPIC_API_KEY``; ``base_url`` or
    ``ANTHROPIC_BASE_URL`` selects the endpoint, so gateways and local servers work.
    The SDK's own retries and spans are off: the runtime retries and traces each call.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 600.0,
        client: AnyClient | None = None,
        context_window: int | None = None,
        provider: Provider | None = None,
        region: str | None = None,
        project_id: str | None = None,
        model_ids: Mapping[str, str] | None = None,
    ) -> None:
        if context_window is not None and context_window <= 0:
            raise UserError(f"context_window must be a positive token count, not {context_window}")
        if provider not in (None, "anthropic", "bedrock", "vertex"):
            raise UserError(f"provider must be anthropic, bedrock or vertex, not {provider!r}")
        if client is not None and provider is not None and provider_of(client) != provider:
            raise UserError(f"provider={provider!r} does not match the {type(client).__name__}")
        self.context_window = context_window
        """The window this channel enforces, when known (e.g. a gateway's limit); every
        agent on this model compacts within it, whatever window it declares."""
        self.model_ids: dict[str, str] = dict(model_ids or {})
        """Agent model names to the ids this channel knows them by (Bedrock, Vertex)."""
        self._client: AnyClient = client or make_client(
            provider or "anthropic",
            api_key=api_key,
            base_url=base_url,
            timeout=timeout,
            region=region,
            project_id=project_id,
        )
        self.provider: Provider = provider_of(self._client)
        self._gateway = GatewayNotice(self.channel)
        if client is None and self.provider == "anthropic" and not _has_credentials(self._client):
            raise UserError(
                "no Anthropic credentials: set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN, or "
                "an Anthropic profile), pass api_key=..., or run offline (--offline)"
            )

    @property
    def base_url(self) -> str:
        return str(self._client.base_url)

    @property
    def channel(self) -> str:
        """Where calls go, as context limits are keyed: the cloud and region, or the base
        URL without credentials."""
        return cloud_channel(self._client) or public_channel(self.base_url)

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        params = request_to_params(request)
        params["model"] = cloud_model(request.model, self.model_ids)
        return without_unsupported_ttl(params, self.provider)

    @property
    def gateway(self) -> str | None:
        """The gateway seen in the responses so far (``"litellm"``, ...), if any."""
        return self._gateway.gateway

    async def request(self, request: ModelRequest) -> ModelResponse:
        if "compaction" in request.settings.extra_body:
            return await self._compaction(request)
        params = self._params(request)
        with _map_errors(self._gateway):
            async with self._client.messages.stream(**params) as stream:
                self._gateway.seen(stream.response.headers)
                saw_headers(stream.response.headers)
                final = await stream.get_final_message()
        return _response_from_sdk(final)

    async def request_streaming(self, request: ModelRequest, on_delta: DeltaSink) -> ModelResponse:
        """``request``, handing each text and thinking delta to ``on_delta`` as it arrives."""
        if "compaction" in request.settings.extra_body:
            return await self._compaction(request)  # one block, nothing to stream
        params = self._params(request)
        with _map_errors(self._gateway):
            async with self._client.messages.stream(**params) as stream:
                self._gateway.seen(stream.response.headers)
                saw_headers(stream.response.headers)
                async for event in stream:
                    if event.type == "text":
                        on_delta("text", event.text)
                    elif event.type == "thinking":
                        on_delta("thinking", event.thinking)
                final = await stream.get_final_message()
        return _response_from_sdk(final)

    async def count_tokens(self, request: ModelRequest) -> int:
        params = self._params(request)
        for key in ("max_tokens", "stop_sequences", "service_tier", "diagnostics"):
            params.pop(key, None)
        body = params.get("extra_body")
        if body:  # sampling options are not count_tokens parameters
            params["extra_body"] = {
                k: v for k, v in body.items() if k not in ("temperature", "top_p", "top_k")
            }
        with _map_errors(self._gateway):
            result = await self._client.messages.count_tokens(**params)
        return int(result.input_tokens)

    async def compact(
        self, request: ModelRequest, instructions: str | None = None
    ) -> ModelResponse:
        """Compaction on demand (beta ``compact-2026-09-04``): the API summarizes
        ``request``'s messages and answers with one signed ``compaction`` block (kept as a
        ``RawBlock``, sent back first in ``messages`` in their place)."""
        return await self.request(compaction_request(request, instructions))

    async def _compaction(self, request: ModelRequest) -> ModelResponse:
        """A compaction request (its ``compaction`` parameter in the settings' extra body):
        sent on the SDK's beta surface, which knows the block, without what shapes a reply."""
        params = self._params(request)
        for key in ("stop_sequences", "diagnostics"):  # they shape a reply, and there is none
            params.pop(key, None)
        if request.settings.forces_tool_use:
            params.pop("tool_choice", None)
        with_beta(params, COMPACT_BETA)
        client: Any = self._client  # the beta surface of whichever client this is
        with _map_errors(self._gateway):
            raw = await client.beta.messages.with_raw_response.create(**params)
            saw_headers(raw.headers)
            final = await raw.parse()
        return _response_from_sdk(final)

    async def aclose(self) -> None:
        await self._client.close()


def _has_credentials(client: AnyClient) -> bool:
    """Whether the first-party SDK client found a key, a token or a credential provider
    (else every request fails with the SDK's ``TypeError`` about authentication headers).
    Cloud clients resolve their own credentials (AWS, Google) and are not checked here."""
    return any(
        getattr(client, name, None) is not None for name in ("api_key", "auth_token", "credentials")
    )


def _cache_control(ttl: CacheTTL) -> dict[str, str]:
    return {"type": "ephemeral"} if ttl == "5m" else {"type": "ephemeral", "ttl": ttl}


def _source_param(block: Image | Document) -> dict[str, Any]:
    if block.url is not None:
        return {"type": "url", "url": block.url}
    if isinstance(block, Document) and block.text is not None:
        return {"type": "text", "media_type": "text/plain", "data": block.text}
    return {"type": "base64", "media_type": block.media_type, "data": block.base64_data}


def _attachment_param(block: Image | Document) -> dict[str, Any]:
    param: dict[str, Any] = {"type": block.type, "source": _source_param(block)}
    if isinstance(block, Document):
        if block.title is not None:
            param["title"] = block.title
        if block.context is not None:
            param["context"] = block.context
    return param


def _tool_result_param(block: ToolResultBlock) -> dict[str, Any]:
    content: str | list[dict[str, Any]] = block.content
    if block.attachments:
        parts = [{"type": "text", "text": block.content}] if block.content else []
        content = parts + [_attachment_param(a) for a in block.attachments]
    param: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": block.tool_use_id,
        "content": content,
    }
    if block.is_error:
        param["is_error"] = True
    return param


def block_param(block: Block) -> dict[str, Any]:
    """One content block in the Messages API's shape (thinking passed back verbatim)."""
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ToolUseBlock):
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    if isinstance(block, ToolResultBlock):
        return _tool_result_param(block)
    if isinstance(block, ThinkingBlock):
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    if isinstance(block, RedactedThinkingBlock):
        return {"type": "redacted_thinking", "data": block.data}
    if isinstance(block, RawBlock):
        return dict(block.block)
    return _attachment_param(block)


def _message_param(message: Message, ttl: CacheTTL | None) -> dict[str, Any]:
    blocks = [block_param(b) for b in message.content]
    if ttl is not None and blocks:
        blocks[-1]["cache_control"] = _cache_control(ttl)
    return {"role": message.role, "content": blocks}


def request_to_params(request: ModelRequest) -> dict[str, Any]:
    """The Messages API body for ``request`` (without ``stream``)."""
    breakpoints = dict(request.message_breakpoints)
    params: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_tokens,
        "messages": [_message_param(m, breakpoints.get(i)) for i, m in enumerate(request.messages)],
    }
    if request.system:
        system = []
        for block in request.system:
            item: dict[str, Any] = {"type": "text", "text": block.text}
            if block.cache:
                item["cache_control"] = _cache_control(block.cache)
            system.append(item)
        params["system"] = system
    if request.tools:
        tools = []
        for tool in request.tools:
            item = {
                "name": tool.name,
                "description": tool.description,
                "input_schema": tool.input_schema,
            }
            if tool.cache:
                item["cache_control"] = _cache_control(tool.cache)
            tools.append(item)
        params["tools"] = tools
    params.update(settings_params(request.settings))
    if request.settings.cache_diagnostics:
        params["diagnostics"] = {"previous_message_id": request.previous_response_id}
    if any(is_compaction_block(b) for m in request.messages[:1] for b in m.content):
        with_beta(params, COMPACT_BETA)  # a request that carries an API-written summary
    return params


COMPACT_BETA = "compact-2026-09-04"
"""The beta of compaction on demand (``compaction`` parameter and block)."""


def is_compaction_block(block: Block) -> bool:
    return isinstance(block, RawBlock) and block.block.get("type") == "compaction"


def with_beta(params: dict[str, Any], beta: str) -> None:
    """Add ``beta`` to the request's ``anthropic-beta`` header (kept with any others)."""
    headers = dict(params.get("extra_headers") or {})
    betas = [b.strip() for b in headers.get("anthropic-beta", "").split(",") if b.strip()]
    if beta not in betas:
        headers["anthropic-beta"] = ",".join([*betas, beta])
    params["extra_headers"] = headers


def _tool_choice(choice: str) -> dict[str, str]:
    if choice in ("auto", "any", "none"):
        return {"type": choice}
    return {"type": "tool", "name": choice}


def settings_params(settings: ModelSettings) -> dict[str, Any]:
    """The request fields for ``settings`` (sampling options travel in ``extra_body``:
    the SDK 2.x no longer names them)."""
    params: dict[str, Any] = {}
    if settings.thinking == "adaptive":
        params["thinking"] = {"type": "adaptive"}
    elif settings.thinking_budget is not None:
        params["thinking"] = {"type": "enabled", "budget_tokens": settings.thinking_budget}
    if settings.stop_sequences:
        params["stop_sequences"] = list(settings.stop_sequences)
    if settings.tool_choice is not None:
        params["tool_choice"] = _tool_choice(settings.tool_choice)
    if settings.service_tier is not None:
        params["service_tier"] = settings.service_tier
    body: dict[str, Any] = {
        key: value
        for key, value in (
            ("temperature", settings.temperature),
            ("top_p", settings.top_p),
            ("top_k", settings.top_k),
        )
        if value is not None
    }
    body.update(settings.extra_body)
    if body:
        params["extra_body"] = body
    if settings.extra_headers:
        params["extra_headers"] = dict(settings.extra_headers)
    return params


def _block_from_sdk(block: Any) -> Block:
    kind = block.type
    if kind == "text":
        return TextBlock(text=block.text)
    if kind == "tool_use":
        return ToolUseBlock(id=block.id, name=block.name, input=dict(block.input))
    if kind == "thinking":
        return ThinkingBlock(thinking=block.thinking, signature=block.signature)
    if kind == "redacted_thinking":
        return RedactedThinkingBlock(data=block.data)
    # server tool blocks and anything newer: kept as sent, and sent back as they came
    return RawBlock(block=block.to_dict(mode="json"))


def _response_from_sdk(message: Any) -> ModelResponse:
    content = [_block_from_sdk(block) for block in message.content]
    usage = message.usage
    creation = getattr(usage, "cache_creation", None)
    diagnostics = getattr(message, "diagnostics", None)
    reason = getattr(diagnostics, "cache_miss_reason", None) if diagnostics else None
    return ModelResponse(
        id=message.id,
        model=message.model,
        content=tuple(content),
        cache_miss=getattr(reason, "type", None),
        stop_reason=message.stop_reason,
        usage=Usage(
            input_tokens=usage.input_tokens or 0,
            output_tokens=usage.output_tokens or 0,
            thinking_tokens=_thinking_tokens(usage),
            cache_read_input_tokens=usage.cache_read_input_tokens or 0,
            cache_creation_input_tokens=usage.cache_creation_input_tokens or 0,
            cache_creation_5m_input_tokens=(
                getattr(creation, "ephemeral_5m_input_tokens", 0) or 0 if creation else 0
            ),
            cache_creation_1h_input_tokens=(
                getattr(creation, "ephemeral_1h_input_tokens", 0) or 0 if creation else 0
            ),
        ),
    )


def _thinking_tokens(usage: Any) -> int:
    details = getattr(usage, "output_tokens_details", None)
    return int(getattr(details, "thinking_tokens", 0) or 0) if details is not None else 0


@contextmanager
def _map_errors(notice: GatewayNotice | None = None) -> Iterator[None]:
    """Translate SDK exceptions into ours, keeping the original as ``__cause__``."""
    try:
        yield
    except anthropic.APIConnectionError as exc:
        raise ModelConnectionError(f"could not reach the model API: {exc}") from exc
    except httpx2.TransportError as exc:  # a stream broken after the headers arrived
        raise ModelConnectionError(f"connection to the model API broke: {exc!r}") from exc
    except anthropic.APIStatusError as exc:
        response = getattr(exc, "response", None)
        headers = response.headers if response is not None else None
        if notice is not None:
            notice.seen(headers)
        saw_headers(headers)
        raise api_error(
            exc.api_message or _plain_message(exc.body) or str(exc),
            status_code=exc.status_code,
            error_type=exc.type,
            body=exc.body,
            headers=headers,
            request_id=exc.request_id,
        ) from exc
    except anthropic.AnthropicError as exc:  # e.g. no token counting on Bedrock
        raise ModelAPIError(str(exc)) from exc


def _plain_message(body: object) -> str | None:
    """A cloud's ``{"message": ...}`` error body (Bedrock's shape)."""
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return None
