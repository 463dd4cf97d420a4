"""A fast stand-in for a LiteLLM proxy, shaped after what the real one (1.108.7) answers.

``tests/test_litellm_proxy.py`` runs the real proxy (slow); this shim lets the mapping and
retry tests run in a second. It forwards to a ``MessagesServer`` over real HTTP and does
what the measured proxy does:

- every answer carries ``x-litellm-*`` headers and no ``request-id``;
- with ``max_input_tokens`` set, a prompt over it (by the gateway's own count: ``ratio`` ×
  our estimate) is refused before it goes upstream with LiteLLM's pre-call-check wording;
- an upstream error comes back wrapped in LiteLLM's text; a 529 ``overloaded_error``
  becomes ``500 api_error``; ``retry-after`` is dropped.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import httpx2
from anyio.abc import SocketAttribute, SocketStream

from anabranch.context._tokens import estimate_request
from anabranch.testing._http import HTTPRequest, Reply, serve_connection
from anabranch.testing._wire import APIFailure, parse_body

_HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "accept-encoding"}


def pre_call_message(model: str, maximum: int, got: int) -> str:
    """LiteLLM 1.108.7's pre-call check refusal, as the proxy words it."""
    return (
        "litellm.ContextWindowExceededError: litellm.BadRequestError: litellm._pre_call_checks:"
        " Context Window exceeded for given call. No models have context window large enough "
        f"for this call.\nModel=anthropic/{model}, Max Input Tokens={maximum}, Got={got}\n"
        f"model={model}. context_window_fallbacks=None. fallbacks=None.\n\n"
        "Set 'context_window_fallback' - https://docs.litellm.ai/docs/routing#fallbacks\n\n"
        f"LiteLLM: model group '{model}' failed with the error above. No fallback was attempted."
    )


def wrapped_message(kind: str, upstream_body: str, model: str) -> str:
    """An upstream error as LiteLLM relays it (``kind``: InternalServerError, ...)."""
    return (
        f"litellm.{kind}: AnthropicError - {upstream_body}\n\n"
        f"LiteLLM: model group '{model}' failed with the error above. No fallback was attempted."
    )


@dataclass
class GatewayShim:
    upstream: str
    max_input_tokens: int | None = None
    ratio: float = 1.0
    refused: list[tuple[int, int]] = field(default_factory=list)
    """(maximum, the gateway's count) of every prompt refused by the pre-call check."""
    on_refuse: Callable[[], None] | None = None
    base_url: str = ""

    def _headers(self, content_type: str) -> list[tuple[str, str]]:
        return [
            ("content-type", content_type),
            ("x-litellm-call-id", str(uuid.uuid4())),
            ("x-litellm-version", "1.108.7"),
            ("x-litellm-attempted-retries", "0"),
        ]

    def _error(self, status: int, error_type: str, message: str) -> Reply:
        body = json.dumps({"type": "error", "error": {"type": error_type, "message": message}})
        return Reply(status, tuple(self._headers("application/json")), (body.encode(),))

    async def handle(self, request: HTTPRequest) -> Reply:
        model = "unknown"
        if request.path.rstrip("/") == "/v1/messages" and self.max_input_tokens is not None:
            try:
                wire = parse_body(request.body)
            except APIFailure:
                wire = None
            if wire is not None:
                model = wire.request.model
                got = int(estimate_request(wire.request) * self.ratio)
                if got > self.max_input_tokens:
                    self.refused.append((self.max_input_tokens, got))
                    if self.on_refuse is not None:
                        self.on_refuse()
                    message = pre_call_message(model, self.max_input_tokens, got)
                    return self._error(400, "invalid_request_error", message)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        async with httpx2.AsyncClient(timeout=30) as client:
            upstream = await client.request(
                request.method, self.upstream + request.path, headers=headers, content=request.body
            )
        body = upstream.content
        if upstream.status_code >= 400:
            text = body.decode()
            if upstream.status_code in (500, 529):
                return self._error(
                    500, "api_error", wrapped_message("InternalServerError", text, model)
                )
            if upstream.status_code == 429:
                message = wrapped_message("RateLimitError", text, model)
                return self._error(429, "rate_limit_error", message)
            message = wrapped_message("BadRequestError", text, model)
            return self._error(upstream.status_code, "invalid_request_error", message)
        content_type = upstream.headers.get("content-type", "application/json")
        return Reply(upstream.status_code, tuple(self._headers(content_type)), (body,))


@asynccontextmanager
async def gateway_shim(
    upstream: str, *, max_input_tokens: int | None = None, ratio: float = 1.0
) -> AsyncIterator[GatewayShim]:
    """A ``GatewayShim`` listening on 127.0.0.1 in front of ``upstream``."""
    shim = GatewayShim(upstream, max_input_tokens=max_input_tokens, ratio=ratio)

    async def serve(stream: SocketStream) -> None:
        await serve_connection(stream, shim.handle)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    async with listener, anyio.create_task_group() as tg:
        shim.base_url = f"http://127.0.0.1:{listener.extra(SocketAttribute.local_port)}"
        tg.start_soon(listener.serve, serve)
        try:
            yield shim
        finally:
            tg.cancel_scope.cancel()
