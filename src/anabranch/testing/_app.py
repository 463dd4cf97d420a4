"""The Messages API application: auth, routing, faults, validation, policy, cache, log.

Independent of sockets: ``handle`` turns one ``HTTPRequest`` into a ``Reply`` (or a hangup).
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from anabranch._thinking_models import prefix_bound
from anabranch.context._tokens import estimate_request
from anabranch.errors import (
    ModelAPIError,
    ModelConnectionError,
    OverloadedError,
    PromptTooLongError,
    RateLimitedError,
)
from anabranch.messages import (
    Block,
    ModelRequest,
    ModelResponse,
    RedactedThinkingBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from anabranch.models._base import Model
from anabranch.testing._cache import PromptCache, prefix_blocks
from anabranch.testing._clouds import CloudRoute, as_messages_request, bedrock_reply, cloud_route
from anabranch.testing._compaction import compaction_response, compaction_wire
from anabranch.testing._diagnostics import CacheDiagnostics
from anabranch.testing._faults import Fault, FaultPlan
from anabranch.testing._http import Hangup, HTTPRequest, Reply
from anabranch.testing._output import fit_to_max_tokens, output_tokens
from anabranch.testing._rate_limits import ProviderBuckets
from anabranch.testing._records import RequestRecord
from anabranch.testing._signing import bind, chained, request_chain, sealed
from anabranch.testing._validation import check_bindings, validate
from anabranch.testing._wire import (
    APIFailure,
    WireRequest,
    error_body,
    message_json,
    parse_body,
    sse_event,
    stream_events,
)

__all__ = ["AppSettings", "MessagesApp"]

log = logging.getLogger(__name__)

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
_RATE_LIMIT_MESSAGE = (
    "This request would exceed the rate limit for your organization of 50 requests per "
    "minute. For details, refer to: https://docs.claude.com/en/api/rate-limits."
)


@dataclass
class AppSettings:
    """Behaviour knobs of one server (see ``MessagesServer`` for their meaning)."""

    context_limit: int = 200_000
    model_limits: Mapping[str, int] = field(default_factory=dict)
    latency: float = 0.0
    retry_after: float = 1.0
    api_key: str | None = None
    rate_limits: ProviderBuckets | None = None


@dataclass
class _Trace:
    """What gets logged about the request being served."""

    endpoint: Literal["messages", "count_tokens", "other"]
    request_id: str
    timestamp: float
    model: str | None = None
    stream: bool = False
    message_id: str | None = None
    usage: Usage | None = None
    error_type: str | None = None
    error_message: str | None = None
    fault: Fault | None = None
    wire: WireRequest | None = field(default=None)
    dropped_thinking: tuple[str, ...] = ()
    limit_headers: dict[str, str] = field(default_factory=dict)

    def record(self, status: int) -> RequestRecord:
        return RequestRecord(
            endpoint=self.endpoint,
            request_id=self.request_id,
            timestamp=self.timestamp,
            status=status,
            model=self.model,
            stream=self.stream,
            message_id=self.message_id,
            usage=self.usage,
            error_type=self.error_type,
            error_message=self.error_message,
            fault=self.fault.kind if self.fault else None,
            request=self.wire.request if self.wire else None,
            compaction=bool(self.wire and self.wire.compaction),
            dropped_thinking=self.dropped_thinking,
        )


def _new_id(prefix: str) -> str:
    return f"{prefix}_01{uuid.uuid4().hex[:22]}"


def _header_number(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))


def _failure_from_model_error(exc: ModelAPIError) -> APIFailure:
    """A policy's ``ModelAPIError`` as the HTTP error the real API would send."""
    if isinstance(exc, RateLimitedError):
        status = exc.status_code or 429
    elif isinstance(exc, OverloadedError):
        status = exc.status_code or 529
    elif isinstance(exc, PromptTooLongError):
        status = exc.status_code or 400
    else:
        status = exc.status_code or 500
    headers = {}
    if exc.retry_after is not None:
        headers["retry-after"] = _header_number(exc.retry_after)
    error_type = exc.error_type or _ERROR_TYPES.get(status, "api_error")
    return APIFailure(status, error_type, str(exc), headers)


class MessagesApp:
    """Serves ``/v1/messages`` and ``/v1/messages/count_tokens`` from a policy."""

    def __init__(
        self,
        *,
        policy: Model,
        cache: PromptCache,
        faults: FaultPlan,
        settings: AppSettings,
        log: list[RequestRecord],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self.cache = cache
        self.faults = faults
        self.settings = settings
        self.log = log
        self._wall_clock = wall_clock
        self._diagnostics = CacheDiagnostics()

    # -- replies -------------------------------------------------------------------------

    def _headers(self, trace: _Trace, content_type: str) -> list[tuple[str, str]]:
        return [
            ("content-type", content_type),
            ("request-id", trace.request_id),
            ("server", "anabranch-testing"),
            *trace.limit_headers.items(),
        ]

    def _json(self, trace: _Trace, status: int, payload: dict[str, Any]) -> Reply:
        self.log.append(trace.record(status))
        body = json.dumps(payload).encode()
        headers = self._headers(trace, "application/json")
        return Reply(status=status, headers=tuple(headers), chunks=(body,))

    def _error(self, trace: _Trace, failure: APIFailure) -> Reply:
        trace.error_type = failure.error_type
        trace.error_message = trace.error_message or failure.message
        self.log.append(trace.record(failure.status))
        body = json.dumps(error_body(failure.error_type, failure.message, trace.request_id))
        headers = self._headers(trace, "application/json")
        retryable = failure.status in (408, 409, 429) or failure.status >= 500
        headers.append(("x-should-retry", "true" if retryable else "false"))
        headers.extend(failure.headers.items())
        return Reply(status=failure.status, headers=tuple(headers), chunks=(body.encode(),))

    def _hangup(self, trace: _Trace, reason: str) -> Hangup:
        trace.error_message = reason
        self.log.append(trace.record(0))
        return Hangup(reason)

    # -- entry point ---------------------------------------------------------------------

    async def handle(self, request: HTTPRequest) -> Reply | Hangup:
        """Answer one HTTP request (a Bedrock or Vertex call too, in the cloud's shape)."""
        route = cloud_route(request)
        if route is not None:
            return await self._cloud(route, request)
        endpoint: Literal["messages", "count_tokens", "other"] = "other"
        if request.path.rstrip("/") == "/v1/messages":
            endpoint = "messages"
        elif request.path.rstrip("/") == "/v1/messages/count_tokens":
            endpoint = "count_tokens"
        trace = _Trace(endpoint, _new_id("req"), self._wall_clock())
        try:
            if endpoint == "other" or request.method != "POST":
                raise APIFailure(404, "not_found_error", "Not Found")
            self._authenticate(request)
            if request.too_large:
                raise APIFailure(413, "request_too_large", "Request exceeds the maximum size")
            if endpoint == "count_tokens":
                return self._count_tokens(trace, request)
            return await self._messages(trace, request)
        except APIFailure as failure:
            return self._error(trace, failure)

    async def _cloud(self, route: CloudRoute, request: HTTPRequest) -> Reply | Hangup:
        try:
            reply = await self.handle(as_messages_request(route, request))
        except APIFailure as failure:
            reply = self._error(_Trace("messages", _new_id("req"), self._wall_clock()), failure)
        if route.provider == "bedrock" and isinstance(reply, Reply):
            return bedrock_reply(reply)
        return reply

    def _authenticate(self, request: HTTPRequest) -> None:
        key = request.headers.get("x-api-key")
        bearer = request.headers.get("authorization", "")
        if bearer.lower().startswith("bearer "):
            key = key or bearer[7:].strip()
        if not key:
            raise APIFailure(401, "authentication_error", "x-api-key header is required")
        if self.settings.api_key is not None and key != self.settings.api_key:
            raise APIFailure(401, "authentication_error", "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            raise APIFailure.invalid("anthropic-version: header is required")

    def _count_tokens(self, trace: _Trace, request: HTTPRequest) -> Reply:
        wire = parse_body(request.body, count_tokens=True)
        trace.wire, trace.model = wire, wire.request.model
        validate(wire, context_limit=None, betas=_betas(request))
        tokens = estimate_request(wire.request)
        trace.usage = Usage(input_tokens=tokens)
        return self._json(trace, 200, {"input_tokens": tokens})

    # -- messages ------------------------------------------------------------------------

    async def _messages(self, trace: _Trace, request: HTTPRequest) -> Reply | Hangup:
        fault = trace.fault = self.faults.next()
        delay = self.settings.latency + (fault.latency if fault else 0.0)
        if delay:
            await anyio.sleep(delay)
        try:
            wire = parse_body(request.body)
        except APIFailure:
            if fault is not None:  # an error fault answers before the body is looked at
                self._raise_for_fault(fault, stream=False)
            raise
        trace.wire, trace.model, trace.stream = wire, wire.request.model, wire.stream
        if fault is not None:
            self._raise_for_fault(fault, stream=wire.stream)
        limit = self.settings.model_limits.get(wire.request.model, self.settings.context_limit)
        validate(wire, context_limit=limit, betas=_betas(request))
        wire, trace.dropped_thinking = check_bindings(wire)
        buckets = self.settings.rate_limits
        if buckets is None:
            response = await self._answer(trace, wire)
        else:
            response = await self._within_limits(buckets, trace, wire)
        if isinstance(response, Hangup):
            return response
        trace.message_id, trace.usage = response.id, response.usage
        diagnostics = None
        if wire.diagnostics:
            diagnostics = self._diagnostics.explain(wire.previous_message_id, wire.request)
        self._diagnostics.remember(response.id, wire.request)
        if wire.stream:
            return self._stream_reply(trace, response, fault, diagnostics)
        dropping = fault is not None and fault.kind == "disconnect"
        if dropping:
            trace.error_message = "connection dropped mid-response"
        reply = self._json(trace, 200, message_json(response, diagnostics))
        if dropping:
            body = reply.chunks[0]
            half = len(body) // 2
            return Reply(reply.status, reply.headers, (body[:half], body[half:]), drop_after=1)
        return reply

    async def _answer(self, trace: _Trace, wire: WireRequest) -> ModelResponse | Hangup:
        if wire.compaction:
            response = await self._ask_policy(trace, compaction_wire(wire))
            if not isinstance(response, Hangup):
                response = compaction_response(wire.request, response)
            return response
        return await self._ask_policy(trace, wire)

    async def _within_limits(
        self, buckets: ProviderBuckets, trace: _Trace, wire: WireRequest
    ) -> ModelResponse | Hangup:
        """``_answer`` under the organisation's rate limits (429 when over one of them);
        the answer carries the limits' state in its headers."""
        max_tokens = wire.request.max_tokens
        wait, refused = buckets.admit(max_tokens)
        if refused is not None:
            headers = {"retry-after": str(max(1, math.ceil(wait))), **buckets.headers()}
            raise APIFailure(429, "rate_limit_error", buckets.refusal(refused), headers)
        try:
            response = await self._answer(trace, wire)
        except BaseException:
            buckets.release(max_tokens)
            trace.limit_headers = buckets.headers()
            raise
        if isinstance(response, Hangup):
            buckets.release(max_tokens)
        else:
            buckets.settle(max_tokens, response.usage)
        trace.limit_headers = buckets.headers()
        return response

    def _raise_for_fault(self, fault: Fault, *, stream: bool) -> None:
        """Raise the error answer of an error fault; the others act later (or never)."""
        kind = fault.kind
        if kind == "rate_limit":
            retry_after = fault.retry_after
            if retry_after is None:
                retry_after = self.settings.retry_after
            headers = {"retry-after": _header_number(retry_after)}
            raise APIFailure(429, "rate_limit_error", _RATE_LIMIT_MESSAGE, headers)
        if kind == "overloaded" or (kind == "stream_error" and not stream):
            headers = {}
            if fault.retry_after is not None:
                headers["retry-after"] = _header_number(fault.retry_after)
            raise APIFailure(529, "overloaded_error", "Overloaded", headers)
        if kind == "server_error":
            raise APIFailure(500, "api_error", "Internal server error")

    async def _ask_policy(self, trace: _Trace, wire: WireRequest) -> ModelResponse | Hangup:
        request = wire.request
        if request.max_tokens == 0:
            response = ModelResponse(content=(), stop_reason="max_tokens")
        else:
            try:
                response = await self.policy.request(request)
            except ModelConnectionError as exc:
                return self._hangup(trace, str(exc))
            except ModelAPIError as exc:
                raise _failure_from_model_error(exc) from exc
            except Exception as exc:
                log.exception("the policy failed on request %s", trace.request_id)
                trace.error_message = f"{type(exc).__name__}: {exc}"
                raise APIFailure(500, "api_error", "Internal server error") from exc
        if any(isinstance(b, ToolResultBlock) for b in response.content):
            trace.error_message = "the policy answered with a tool_result block"
            raise APIFailure(500, "api_error", "Internal server error")
        if request.settings.tool_choice == "none" and any(
            isinstance(b, ToolUseBlock) for b in response.content
        ):  # the real API never calls a tool when told not to
            trace.error_message = "the policy called a tool under tool_choice none"
            raise APIFailure(500, "api_error", "Internal server error")
        forced = request.settings.tool_choice
        if forced not in (None, "auto", "none") and not any(
            isinstance(b, ToolUseBlock) and forced in ("any", b.name) for b in response.content
        ):  # the real API always calls the tool it is told to
            trace.error_message = f"the policy did not call a tool under tool_choice {forced}"
            raise APIFailure(500, "api_error", "Internal server error")
        blocks = prefix_blocks(request, wire.cache_marks, salt=wire.salt)
        usage = self.cache.account(request.model, blocks, estimate_request(request))
        response = fit_to_max_tokens(response, request.max_tokens)
        output = response.usage.output_tokens or output_tokens(response.content)
        output = min(output, request.max_tokens)
        if prefix_bound(request.model):
            response = _bound_to_prefix(request, response)
        thinking = tuple(b for b in response.content if b.type in ("thinking", "redacted_thinking"))
        thought = response.usage.thinking_tokens or (output_tokens(thinking) if thinking else 0)
        return response.model_copy(
            update={
                "id": _new_id("msg"),
                "model": request.model,
                "usage": usage.model_copy(
                    update={"output_tokens": output, "thinking_tokens": min(thought, output)}
                ),
            }
        )

    def _stream_reply(
        self,
        trace: _Trace,
        response: ModelResponse,
        fault: Fault | None,
        diagnostics: dict[str, Any] | None = None,
    ) -> Reply:
        events = [sse_event(e) for e in stream_events(response, diagnostics)]
        headers = self._headers(trace, "text/event-stream; charset=utf-8")
        headers.append(("cache-control", "no-cache"))
        cut = max(3, len(events) // 2)  # after message_start, ping and a block start
        drop_after: int | None = None
        if fault is not None and fault.kind == "stream_error":
            trace.error_type, trace.error_message = "overloaded_error", "Overloaded"
            error = error_body("overloaded_error", "Overloaded", trace.request_id)
            events = [*events[:cut], sse_event(error)]
        elif fault is not None and fault.kind == "disconnect":
            trace.error_message = "connection dropped mid-stream"
            drop_after = cut
        self.log.append(trace.record(200))
        return Reply(200, tuple(headers), tuple(events), stream=True, drop_after=drop_after)


def _betas(request: HTTPRequest) -> frozenset[str]:
    raw = request.headers.get("anthropic-beta", "")
    return frozenset(b.strip() for b in raw.split(",") if b.strip())


def _bound_to_prefix(request: ModelRequest, response: ModelResponse) -> ModelResponse:
    """``response`` with each thinking block signed for the prefix it follows: the
    request's system, tools and messages, and the blocks before it in this answer."""
    state, first = request_chain(request.system, request.tools, request.messages)
    for message in request.messages[first:]:
        state = chained(state, message)
    content: list[Block] = []
    for block in response.content:
        if isinstance(block, ThinkingBlock | RedactedThinkingBlock):
            block = bind(block, sealed(state, content))
        content.append(block)
    return response.model_copy(update={"content": tuple(content)})
