"""Errors from the Messages API, a gateway in front of it, or a cloud, as ours.

Every channel words a full context window differently; each wording recognised here yields
a ``PromptTooLongError`` carrying the limit and, when the channel states it, its own count
of the rejected prompt (the runtime compares that count with its estimate):

- the API: ``prompt is too long: 7059 tokens > 6000 maximum`` and ``input length and
  `max_tokens` exceed context limit: 5000 + 2000 > 6000``;
- a gateway that wraps the API's text (LiteLLM: ``litellm.BadRequestError: AnthropicException
  - {... prompt is too long ...}``);
- LiteLLM's own pre-call check: ``litellm.ContextWindowExceededError: ... Context Window
  exceeded for given call ... Max Input Tokens=6000, Got=7059``;
- OpenAI-style gateways: code ``context_length_exceeded``, ``maximum context length is 8192
  tokens. However, your messages resulted in 9000 tokens``;
- Bedrock: ``Input is too long for requested model.``

Overload and rate limits are classified by the wrapped error type too, whatever the status:
LiteLLM turns a 529 ``overloaded_error`` into ``500 api_error`` with the original body in the
message.
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from anabranch.errors import (
    ModelAPIError,
    OverloadedError,
    PromptTooLongError,
    RateLimitedError,
    ServerError,
)
from anabranch.models._gateway import detect_gateway

__all__ = [
    "ContextLimit",
    "api_error",
    "parse_context_limit",
    "retry_after_seconds",
]


@dataclass(frozen=True)
class ContextLimit:
    """What a context-limit error says: the limit and the channel's count, when stated."""

    maximum: int | None = None
    tokens: int | None = None


def _int(text: str) -> int:
    return int(text.replace(",", "").replace("_", ""))


_N = r"([\d,_]+)"
_COUNTED: tuple[tuple[re.Pattern[str], str], ...] = (
    # (pattern, group order): "tm" = tokens then maximum, "mt" = maximum then tokens
    (re.compile(rf"prompt is too long: {_N} tokens > {_N} maximum", re.I), "tm"),
    (re.compile(rf"Max Input Tokens\s*=\s*{_N}\s*,\s*Got\s*=\s*{_N}", re.I), "mt"),
    (
        re.compile(
            rf"maximum context length is {_N} tokens\D{{0,80}}?(?:resulted in|requested) {_N}",
            re.I,
        ),
        "mt",
    ),
)
_INPUT_PLUS_OUTPUT = re.compile(rf"exceed context limit: {_N} \+ {_N} > {_N}", re.I)
_WORDING = re.compile(
    r"prompt is too long|ContextWindowExceeded|context[_ ]window[_ ]exceeded|context window "
    r"exceeded|context_length_exceeded|maximum context length|exceed context limit|"
    r"input is too long for requested model|too many input tokens|input tokens exceed",
    re.I,
)


def parse_context_limit(message: str, code: str | None = None) -> ContextLimit | None:
    """The context limit ``message`` (or an error ``code``) reports, or ``None``."""
    for pattern, order in _COUNTED:
        match = pattern.search(message)
        if match:
            first, second = _int(match.group(1)), _int(match.group(2))
            tokens, maximum = (first, second) if order == "tm" else (second, first)
            return ContextLimit(maximum=maximum, tokens=tokens)
    match = _INPUT_PLUS_OUTPUT.search(message)
    if match:
        prompt, output, limit = (_int(g) for g in match.groups())
        return ContextLimit(maximum=max(1, limit - output), tokens=prompt)
    if _WORDING.search(message) or code in {"context_length_exceeded", "context_window_exceeded"}:
        return ContextLimit()
    return None


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """Seconds a ``retry-after-ms`` or ``retry-after`` header asks to wait, if any."""
    if not headers:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        try:
            parsed = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        return max(0.0, parsed.timestamp() - time.time())


def _error_code(body: object) -> str | None:
    """``error.code`` (OpenAI style) or ``error.details.error_code`` of an error body."""
    if not isinstance(body, Mapping):
        return None
    error = body.get("error", body)
    if not isinstance(error, Mapping):
        return None
    code = error.get("code")
    if isinstance(code, str):
        return code
    details = error.get("details")
    if isinstance(details, Mapping) and isinstance(details.get("error_code"), str):
        return str(details["error_code"])
    return None


_AWS_TYPES = {
    "throttlingexception": "rate_limit_error",
    "servicequotaexceededexception": "rate_limit_error",
    "serviceunavailableexception": "overloaded_error",
    "modelnotreadyexception": "overloaded_error",
    "validationexception": "invalid_request_error",
    "accessdeniedexception": "permission_error",
    "unrecognizedclientexception": "authentication_error",
    "resourcenotfoundexception": "not_found_error",
    "internalserverexception": "api_error",
    "modelstreamerrorexception": "api_error",
    "modeltimeoutexception": "api_error",
    "modelerrorexception": "api_error",
}
"""Bedrock's error types (``x-amzn-errortype``, or a stream's exception frame) as the API's."""


def _normalized_type(error_type: str | None, headers: Mapping[str, str] | None) -> str | None:
    if error_type is None and headers:
        aws = headers.get("x-amzn-errortype")
        error_type = aws.split(":", 1)[0] if aws else None
    if error_type is None:
        return None
    return _AWS_TYPES.get(error_type.lower(), error_type)


_WRAPPED_OVERLOADED = re.compile(r"overloaded_error|\bOverloaded\b")
_WRAPPED_RATE_LIMIT = re.compile(r"rate_limit_error|RateLimitError|ThrottlingException")


def api_error(
    message: str,
    *,
    status_code: int | None,
    error_type: str | None,
    body: object = None,
    headers: Mapping[str, str] | None = None,
    request_id: str | None = None,
) -> ModelAPIError:
    """The ``ModelAPIError`` subclass for an error answer from any channel."""
    gateway = detect_gateway(headers)
    error_type = _normalized_type(error_type, headers)
    kwargs: dict[str, Any] = {
        "status_code": status_code,
        "error_type": error_type,
        "request_id": request_id or (headers or {}).get("x-litellm-call-id"),
        "retry_after": retry_after_seconds(headers),
        "gateway": gateway,
    }
    status = status_code
    if status != 429 and error_type not in {"overloaded_error", "rate_limit_error"}:
        limit = parse_context_limit(message, _error_code(body))
        if limit is not None:
            return PromptTooLongError(message, maximum=limit.maximum, tokens=limit.tokens, **kwargs)
    if error_type == "overloaded_error" or status == 529 or _WRAPPED_OVERLOADED.search(message):
        return OverloadedError(message, **kwargs)
    if error_type == "rate_limit_error" or status == 429 or _WRAPPED_RATE_LIMIT.search(message):
        return RateLimitedError(message, **kwargs)
    if error_type == "api_error" or (status is not None and status >= 500):
        return ServerError(message, **kwargs)
    return ModelAPIError(message, **kwargs)
