"""Bedrock and Vertex AI in front of the local Messages API, as the SDK's clients call them.

``AsyncAnthropicBedrock`` posts ``/model/{model}/invoke`` (or ``invoke-with-response-stream``)
with the model out of the body, signs it with SigV4 and reads the stream as AWS event-stream
frames; ``AsyncAnthropicVertex`` posts ``/v1/projects/{p}/locations/{r}/publishers/anthropic/
models/{model}:rawPredict`` (or ``streamRawPredict``) with a bearer token and reads SSE. Both
put ``anthropic_version`` in the body. ``cloud_route`` recognises such a request,
``as_messages_request`` checks it as strictly as the cloud does and turns it into a
``/v1/messages`` request, and ``bedrock_reply`` turns the answer into Bedrock's shape
(event-stream frames; errors as ``x-amzn-errortype`` + ``{"message": ...}``).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
from dataclasses import dataclass, replace
from typing import Any, Literal
from urllib.parse import unquote

from anabranch.context._pricing import claude_generation
from anabranch.testing._http import HTTPRequest, Reply
from anabranch.testing._wire import APIFailure

__all__ = ["CloudRoute", "as_messages_request", "bedrock_reply", "cloud_route"]

_BEDROCK = re.compile(r"^/model/(?P<model>[^/]+)/(?P<op>invoke|invoke-with-response-stream)$")
_VERTEX = re.compile(
    r"^/v1/projects/(?P<project>[^/]+)/locations/(?P<region>[^/]+)/publishers/anthropic/"
    r"models/(?P<model>[^/:]+):(?P<op>rawPredict|streamRawPredict)$"
)
API_VERSION = "2023-06-01"


@dataclass(frozen=True)
class CloudRoute:
    provider: Literal["bedrock", "vertex"]
    model: str
    stream: bool


def cloud_route(request: HTTPRequest) -> CloudRoute | None:
    """The cloud call ``request`` is, or ``None`` for any other path."""
    path = request.path.split("?", 1)[0]
    match = _BEDROCK.match(path)
    if match:
        op = match.group("op")
        return CloudRoute("bedrock", unquote(match.group("model")), op.endswith("stream"))
    match = _VERTEX.match(path)
    if match:
        op = match.group("op")
        return CloudRoute("vertex", unquote(match.group("model")), op == "streamRawPredict")
    return None


def _authenticate(route: CloudRoute, request: HTTPRequest) -> None:
    auth = request.headers.get("authorization", "")
    if route.provider == "bedrock":
        if not auth.startswith("AWS4-HMAC-SHA256 Credential=") or "Signature=" not in auth:
            raise APIFailure(403, "permission_error", "Missing Authentication Token")
        if not request.headers.get("x-amz-date"):
            raise APIFailure(403, "permission_error", "Missing x-amz-date")
    elif not auth.lower().startswith("bearer ") or not auth[7:].strip():
        raise APIFailure(
            401, "authentication_error", "Request is missing required authentication credential."
        )


def as_messages_request(route: CloudRoute, request: HTTPRequest) -> HTTPRequest:
    """The ``/v1/messages`` request a cloud call stands for (raises ``APIFailure``)."""
    _authenticate(route, request)
    try:
        body: Any = json.loads(request.body or b"null")
    except ValueError as exc:
        raise APIFailure.invalid("Malformed input request: not JSON") from exc
    if not isinstance(body, dict):
        raise APIFailure.invalid("Malformed input request: expected an object")
    version = body.pop("anthropic_version", None)
    if not isinstance(version, str) or not version:
        raise APIFailure.invalid("Malformed input request: anthropic_version is required")
    if "model" in body:
        raise APIFailure.invalid("Malformed input request: extraneous key [model] is not permitted")
    if route.provider == "bedrock" and "stream" in body:
        raise APIFailure.invalid(
            "Malformed input request: extraneous key [stream] is not permitted"
        )
    if route.provider == "vertex" and bool(body.get("stream")) != route.stream:
        raise APIFailure.invalid("stream must match the method (streamRawPredict)")
    if route.provider == "bedrock" and _has_1h_ttl(body):
        generation = claude_generation(route.model)
        if generation is None or generation < (4, 5):
            raise APIFailure.invalid(
                f"The model {route.model} does not support the 1h cache TTL; use the default 5m"
            )
    body["model"] = route.model
    if route.stream:
        body["stream"] = True
    headers = dict(request.headers)
    headers.setdefault("x-api-key", f"{route.provider}-credentials")
    headers.setdefault("anthropic-version", API_VERSION)
    return replace(request, path="/v1/messages", headers=headers, body=json.dumps(body).encode())


def _has_1h_ttl(value: Any) -> bool:
    if isinstance(value, dict):
        control = value.get("cache_control")
        if isinstance(control, dict) and control.get("ttl") == "1h":
            return True
        return any(_has_1h_ttl(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_1h_ttl(v) for v in value)
    return False


# --------------------------------------------------------------------------- Bedrock shape

_AWS_ERRORS = {
    400: "ValidationException",
    401: "UnrecognizedClientException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    413: "ValidationException",
    429: "ThrottlingException",
    500: "InternalServerException",
    529: "ServiceUnavailableException",
}
_AWS_STATUS = {529: 503, 401: 403}


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return (
        struct.pack("!B", len(raw_name))
        + raw_name
        + b"\x07"
        + struct.pack("!H", len(raw_value))
        + raw_value
    )


def event_frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One AWS event-stream message (prelude, CRCs, string headers, payload)."""
    encoded = b"".join(_header(k, v) for k, v in headers.items())
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack("!II", total, len(encoded))
    prelude += struct.pack("!I", binascii.crc32(prelude) & 0xFFFFFFFF)
    message = prelude + encoded + payload
    return message + struct.pack("!I", binascii.crc32(message) & 0xFFFFFFFF)


def _chunk_frame(event: dict[str, Any]) -> bytes:
    data = base64.b64encode(json.dumps(event).encode()).decode()
    return event_frame(
        {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"},
        json.dumps({"bytes": data}).encode(),
    )


def _exception_frame(kind: str, message: str) -> bytes:
    return event_frame(
        {
            ":exception-type": kind,
            ":content-type": "application/json",
            ":message-type": "exception",
        },
        json.dumps({"message": message}).encode(),
    )


def _sse_data(chunk: bytes) -> dict[str, Any]:
    for line in chunk.decode().splitlines():
        if line.startswith("data: "):
            data = json.loads(line[6:])
            if isinstance(data, dict):
                return data
    raise ValueError("an SSE chunk without data")


def bedrock_reply(reply: Reply) -> Reply:
    """``reply`` (a Messages API answer) as Bedrock would send it."""
    kept = [(k, v) for k, v in reply.headers if k not in ("content-type", "request-id")]
    request_id = dict(reply.headers).get("request-id", "")
    kept.append(("x-amzn-requestid", request_id))
    if reply.status >= 400:
        payload = json.loads(b"".join(reply.chunks) or b"{}")
        message = str(payload.get("error", {}).get("message", "error"))
        kind = _AWS_ERRORS.get(reply.status, "InternalServerException")
        headers = [*kept, ("content-type", "application/json"), ("x-amzn-errortype", kind)]
        body = json.dumps({"message": message}).encode()
        return Reply(_AWS_STATUS.get(reply.status, reply.status), tuple(headers), (body,))
    if not reply.stream:
        return replace(reply, headers=(*kept, ("content-type", "application/json")))
    frames = []
    for chunk in reply.chunks:
        event = _sse_data(chunk)
        if event.get("type") == "error":
            error = event.get("error", {})
            kind = "serviceUnavailableException"
            if error.get("type") != "overloaded_error":
                kind = "modelStreamErrorException"
            frames.append(_exception_frame(kind, str(error.get("message", "error"))))
        else:
            frames.append(_chunk_frame(event))
    stream_headers = (*kept, ("content-type", "application/vnd.amazon.eventstream"))
    return replace(reply, headers=stream_headers, chunks=tuple(frames))
