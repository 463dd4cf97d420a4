"""Injected faults: what the SDK sees, and what our AnthropicModel turns them into."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.types import MessageParam

from anabranch.errors import (
    ModelAPIError,
    ModelConnectionError,
    OverloadedError,
    PromptTooLongError,
    RateLimitedError,
    ServerError,
)
from anabranch.messages import Message, ModelRequest
from anabranch.models._anthropic import AnthropicModel
from anabranch.testing import Fault, FaultKind, FaultPlan, MessagesServer, TestModel

pytestmark = pytest.mark.anyio

USER: list[MessageParam] = [{"role": "user", "content": "Tell me a long story about the sea."}]
STORY = "Once upon a time the sea was calm, and then it was not calm at all. " * 4


@asynccontextmanager
async def serve(
    **options: Any,
) -> AsyncIterator[tuple[MessagesServer, anthropic.AsyncAnthropic]]:
    async with MessagesServer([STORY] * 10, **options) as srv:
        client = anthropic.AsyncAnthropic(base_url=srv.base_url, api_key="test", max_retries=0)
        try:
            yield srv, client
        finally:
            await client.close()


async def create(client: anthropic.AsyncAnthropic) -> anthropic.types.Message:
    return await client.messages.create(model="m", max_tokens=200, messages=USER)


async def stream_text(client: anthropic.AsyncAnthropic) -> str:
    async with client.messages.stream(model="m", max_tokens=200, messages=USER) as stream:
        return await stream.get_final_text()


async def test_rate_limit_is_429_with_retry_after() -> None:
    async with serve() as (srv, client):
        srv.inject("rate_limit", retry_after=0.25)
        with pytest.raises(anthropic.RateLimitError) as caught:
            await create(client)
        after = await create(client)  # one-shot: the next request is fine
    error = caught.value
    assert error.status_code == 429 and error.type == "rate_limit_error"
    assert error.response.headers["retry-after"] == "0.25"
    assert after.content[0].type == "text"
    assert [(r.status, r.fault) for r in srv.log] == [(429, "rate_limit"), (200, None)]


async def test_sdk_retries_after_rate_limit_and_overload() -> None:
    async with serve() as (srv, client):
        srv.inject("rate_limit", retry_after=0.01)
        srv.inject("overloaded", retry_after=0.01)
        message = await client.with_options(max_retries=2).messages.create(
            model="m", max_tokens=200, messages=USER
        )
    assert message.content[0].type == "text"
    assert [r.status for r in srv.log] == [429, 529, 200]


async def test_overloaded_is_529() -> None:
    async with serve() as (srv, client):
        srv.inject("overloaded")
        with pytest.raises(anthropic.OverloadedError) as caught:
            await create(client)
    assert caught.value.status_code == 529
    assert caught.value.type == "overloaded_error"


async def test_server_error_is_500_api_error() -> None:
    async with serve() as (srv, client):
        srv.inject("server_error")
        with pytest.raises(anthropic.InternalServerError) as caught:
            await create(client)
    assert caught.value.status_code == 500
    assert caught.value.type == "api_error"
    assert caught.value.response.headers["x-should-retry"] == "true"


async def test_stream_error_arrives_mid_stream_with_status_200() -> None:
    async with serve() as (srv, client):
        srv.inject("stream_error")
        received: list[str] = []
        with pytest.raises(anthropic.APIStatusError) as caught:
            async with client.messages.stream(model="m", max_tokens=200, messages=USER) as s:
                async for event in s:
                    received.append(event.type)
    error = caught.value
    assert type(error) is anthropic.APIStatusError
    assert error.status_code == 200
    assert error.type == "overloaded_error"
    assert "message_start" in received and "message_stop" not in received
    [record] = srv.log
    assert (record.status, record.error_type, record.fault) == (
        200,
        "overloaded_error",
        "stream_error",
    )


async def test_stream_error_on_a_plain_request_is_a_529() -> None:
    async with serve() as (srv, client):
        srv.inject("stream_error")
        with pytest.raises(anthropic.OverloadedError):
            await create(client)


async def test_disconnect_mid_json_body_is_a_connection_error() -> None:
    async with serve() as (srv, client):
        srv.inject("disconnect")
        with pytest.raises(anthropic.APIConnectionError):
            await create(client)
        after = await create(client)
    assert after.content[0].type == "text"
    assert srv.log[0].fault == "disconnect"


async def test_disconnect_mid_stream_breaks_the_stream() -> None:
    async with serve() as (srv, client):
        srv.inject("disconnect")
        with pytest.raises(httpx2.TransportError):
            await stream_text(client)
        assert await stream_text(client) == STORY


async def test_latency_fault_still_answers() -> None:
    async with serve() as (srv, client):
        srv.inject("latency", delay=0.05)
        message = await create(client)
    assert message.content[0].type == "text"
    assert srv.log[0].fault == "latency" and srv.log[0].status == 200


async def test_faults_queued_at_construction_are_used_in_order() -> None:
    faults: list[Fault | FaultKind] = ["overloaded", Fault(kind="server_error")]
    async with serve(faults=faults) as (srv, client):
        for _ in range(3):
            try:
                await create(client)
            except anthropic.APIStatusError:
                pass
    assert [r.status for r in srv.log] == [529, 500, 200]


async def test_seeded_random_faults_are_reproducible() -> None:
    async def kinds(seed: int) -> list[str | None]:
        async with serve(fault_rate=0.5, seed=seed, retry_after=0.0) as (srv, client):
            for _ in range(12):
                try:
                    await create(client)
                except (anthropic.APIError, httpx2.TransportError):
                    pass
            return [r.fault for r in srv.log]

    first, second = await kinds(7), await kinds(7)
    assert first == second
    assert any(k is None for k in first) and any(k is not None for k in first)


# -- through our AnthropicModel --------------------------------------------------------

REQUEST = ModelRequest(model="m", messages=(Message.user("Tell me about the sea."),))


@asynccontextmanager
async def model_for(**options: Any) -> AsyncIterator[tuple[MessagesServer, AnthropicModel]]:
    async with MessagesServer(TestModel(), **options) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        try:
            yield srv, model
        finally:
            await model.aclose()


@pytest.mark.parametrize(
    ("kind", "error_type", "status"),
    [
        ("rate_limit", RateLimitedError, 429),
        ("overloaded", OverloadedError, 529),
        ("server_error", ServerError, 500),
        ("stream_error", OverloadedError, 200),
    ],
)
async def test_model_maps_status_faults(kind: FaultKind, error_type: type, status: int) -> None:
    async with model_for() as (srv, model):
        srv.inject(kind, retry_after=0.5 if kind == "rate_limit" else None)
        with pytest.raises(error_type) as caught:
            await model.request(REQUEST)
        recovered = await model.request(REQUEST)
    error = caught.value
    assert isinstance(error, ModelAPIError)
    assert error.status_code == status
    assert error.request_id == srv.log[0].request_id
    if kind == "rate_limit":
        assert error.retry_after == 0.5
    assert recovered.content


async def test_model_maps_disconnect_to_connection_error() -> None:
    async with model_for() as (srv, model):
        srv.inject("disconnect")
        with pytest.raises(ModelConnectionError):
            await model.request(REQUEST)


async def test_model_maps_prompt_too_long_with_numbers() -> None:
    long_request = ModelRequest(model="m", messages=(Message.user("sea " * 500),))
    async with model_for(context_limit=300) as (_, model):
        with pytest.raises(PromptTooLongError) as caught:
            await model.request(long_request)
        counted = await model.count_tokens(long_request)
    assert caught.value.maximum == 300
    assert caught.value.tokens == counted
    assert caught.value.status_code == 400


def test_fault_plan_serves_queued_faults_before_random_ones() -> None:
    plan = FaultPlan(["server_error"], rate=1.0, seed=1, kinds=["latency"])
    plan.push(Fault(kind="rate_limit", retry_after=3))
    drawn = [plan.next() for _ in range(3)]
    assert [f.kind if f else None for f in drawn] == ["server_error", "rate_limit", "latency"]
    assert drawn[2] is not None and drawn[2].latency > 0
    assert drawn[1] is not None and drawn[1].latency == 0.0
    assert plan.pending == 0


def test_fault_rate_outside_zero_to_one_is_rejected() -> None:
    with pytest.raises(ValueError, match="fault_rate"):
        MessagesServer(fault_rate=1.5)
