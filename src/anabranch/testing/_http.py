"""A small HTTP/1.1 server connection on anyio + h11 (runs on asyncio and trio).

Keep-alive, request bodies read in full (up to ``MAX_BODY_BYTES``), responses with a
``content-length`` or streamed chunked, and on purpose: a connection dropped mid-response.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import h11
from anyio.abc import ByteStream

__all__ = ["MAX_BODY_BYTES", "Hangup", "HTTPRequest", "Reply", "serve_connection"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 * 1024 * 1024
"""The API rejects Messages and count_tokens bodies above 32 MB with a 413."""
_READ_SIZE = 65536


@dataclass(frozen=True)
class HTTPRequest:
    """One request as the application sees it (header names lower-case)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    too_large: bool = False


@dataclass(frozen=True)
class Reply:
    """One response. ``stream`` sends the chunks chunked (no ``content-length``).

    ``drop_after``: send the headers and this many chunks, then close the socket.
    """

    status: int
    headers: tuple[tuple[str, str], ...] = ()
    chunks: tuple[bytes, ...] = ()
    stream: bool = False
    drop_after: int | None = None


@dataclass(frozen=True)
class Hangup:
    """Close the connection without answering."""

    reason: str = field(default="")


Handler = Callable[[HTTPRequest], Awaitable[Reply | Hangup]]


class _Closed(Exception):
    """The peer went away or the connection is unusable."""


async def _next_event(conn: h11.Connection, stream: ByteStream) -> h11.Event | type[h11.PAUSED]:
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise _Closed(str(exc)) from exc
        if isinstance(event, h11.Event) or event is h11.PAUSED:
            return event
        try:
            data = await stream.receive(_READ_SIZE)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            data = b""
        conn.receive_data(data)


async def _read_request(conn: h11.Connection, stream: ByteStream) -> HTTPRequest | None:
    event = await _next_event(conn, stream)
    if isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
        return None
    if not isinstance(event, h11.Request):
        raise _Closed(f"unexpected {event!r}")
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
    target = event.target.decode("latin-1")
    body = bytearray()
    too_large = False
    while True:
        part = await _next_event(conn, stream)
        if isinstance(part, h11.Data):
            if len(body) + len(part.data) > MAX_BODY_BYTES:
                too_large = True
            else:
                body.extend(part.data)
        elif isinstance(part, h11.EndOfMessage):
            break
        else:
            raise _Closed(f"unexpected {part!r}")
    return HTTPRequest(
        method=event.method.decode("ascii"),
        path=target.split("?", 1)[0],
        headers=headers,
        body=bytes(body),
        too_large=too_large,
    )


async def _send(conn: h11.Connection, stream: ByteStream, event: h11.Event) -> None:
    data = conn.send(event)
    if data:
        try:
            await stream.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise _Closed("peer went away") from exc


async def _write_reply(conn: h11.Connection, stream: ByteStream, reply: Reply) -> bool:
    """Send ``reply``; False when the connection must be closed afterwards."""
    headers = list(reply.headers)
    if not reply.stream:
        length = sum(len(c) for c in reply.chunks)
        headers.append(("content-length", str(length)))
    await _send(conn, stream, h11.Response(status_code=reply.status, headers=headers))
    for index, chunk in enumerate(reply.chunks):
        if reply.drop_after is not None and index >= reply.drop_after:
            return False
        await _send(conn, stream, h11.Data(data=chunk))
    if reply.drop_after is not None:
        return False
    await _send(conn, stream, h11.EndOfMessage())
    return True


async def serve_connection(stream: ByteStream, handler: Handler) -> None:
    """Serve requests on one connection until either side closes it."""
    conn = h11.Connection(h11.SERVER)
    async with stream:
        try:
            while True:
                request = await _read_request(conn, stream)
                if request is None:
                    return
                outcome = await handler(request)
                if isinstance(outcome, Hangup):
                    return
                if not await _write_reply(conn, stream, outcome):
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except _Closed as exc:
            log.debug("connection closed: %s", exc)
        except h11.LocalProtocolError:
            log.exception("could not write a response")
