"""MessagesServer through the real SDK: JSON and SSE round trips, count_tokens, policies."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anthropic
import anyio
import httpx2
import pytest
from anthropic.types import MessageParam, ToolParam

from anabranch.errors import ModelConnectionError, RateLimitedError
from anabranch.messages import (
    ModelRequest,
    ModelResponse,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from anabranch.testing import (
    FunctionModel,
    MessagesServer,
    ScriptedPolicy,
    TestModel,
)

pytestmark = pytest.mark.anyio

WEATHER_TOOL: ToolParam = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    },
}
USER: list[MessageParam] = [{"role": "user", "content": "What is the weather in Paris?"}]


@asynccontextmanager
async def serve(
    policy: Any = None, **options: Any
) -> AsyncIterator[tuple[MessagesServer, anthropic.AsyncAnthropic]]:
    async with MessagesServer(policy, **options) as srv:
        client = anthropic.AsyncAnthropic(base_url=srv.base_url, api_key="test", max_retries=0)
        try:
            yield srv, client
        finally:
            await client.close()


async def test_create_returns_policy_text_with_api_shape() -> None:
    async with serve(["Bonjour from the script"]) as (srv, client):
        raw = await client.messages.with_raw_response.create(
            model="claude-opus-4-8", max_tokens=100, messages=USER
        )
        message = await raw.parse()
    assert message.content[0].type == "text"
    assert message.content[0].text == "Bonjour from the script"
    assert message.id.startswith("msg_")
    assert message.model == "claude-opus-4-8"
    assert message.stop_reason == "end_turn"
    assert raw.headers["request-id"].startswith("req_")
    assert message.usage.output_tokens > 0
    [record] = srv.log
    assert (record.endpoint, record.status, record.stream) == ("messages", 200, False)
    assert record.message_id == message.id
    assert record.request is not None and record.request.messages[0].text == USER[0]["content"]


async def test_response_ids_are_unique_per_response() -> None:
    async with serve(TestModel()) as (_, client):
        first = await client.messages.create(model="m", max_tokens=50, messages=USER)
        second = await client.messages.create(model="m", max_tokens=50, messages=USER)
    assert first.id != second.id


async def test_tool_use_round_trip_json() -> None:
    async with serve(TestModel()) as (_, client):
        message = await client.messages.create(
            model="m", max_tokens=100, messages=USER, tools=[WEATHER_TOOL]
        )
    assert message.stop_reason == "tool_use"
    [block] = message.content
    assert block.type == "tool_use"
    assert block.name == "get_weather"
    assert block.id.startswith("toolu_")
    assert set(block.input) == {"city", "days"}


async def test_stream_text_arrives_in_several_deltas() -> None:
    text = "The weather in Paris is sunny with a light breeze from the west."
    async with serve([text]) as (srv, client):
        async with client.messages.stream(model="m", max_tokens=100, messages=USER) as stream:
            event_types = [event.type async for event in stream]
            final = await stream.get_final_message()
    raw_order = [t for t in event_types if t not in ("text",)]
    assert raw_order[0] == "message_start"
    assert raw_order[1:3] == ["content_block_start", "content_block_delta"]
    assert raw_order[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert event_types.count("text") >= 2
    assert final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 1
    assert srv.log[0].stream is True


async def test_stream_wire_has_ping_and_cumulative_message_delta_usage() -> None:
    async with serve(["hello there"]) as (srv, _):
        async with httpx2.AsyncClient(base_url=srv.base_url) as http:
            response = await http.post(
                "/v1/messages",
                headers={"x-api-key": "k", "anthropic-version": "2026-10-21"},
                json={"model": "m", "max_tokens": 10, "stream": True, "messages": USER},
            )
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line[7:] for line in response.text.splitlines() if line.startswith("event: ")]
    assert events[:2] == ["message_start", "ping"]
    assert "message_delta" in events and events[-1] == "message_stop"
    delta_line = response.text.split("event: message_delta\ndata: ")[1].split("\n")[0]
    usage = anthropic.types.MessageDeltaEvent.model_validate_json(delta_line).usage
    assert usage.input_tokens is not None and usage.input_tokens > 0
    assert usage.output_tokens == srv.log[0].output_tokens


async def test_stream_tool_use_with_input_json_deltas() -> None:
    call = ToolUseBlock(
        id="toolu_abc", name="get_weather", input={"city": "Paris, France", "days": 3}
    )
    async with serve([[TextBlock(text="Let me check."), call]]) as (_, client):
        async with client.messages.stream(
            model="m", max_tokens=100, messages=USER, tools=[WEATHER_TOOL]
        ) as stream:
            partials = [event.partial_json async for event in stream if event.type == "input_json"]
            final = await stream.get_final_message()
    assert len([p for p in partials if p]) >= 2
    assert final.stop_reason == "tool_use"
    assert final.content[1].type == "tool_use"
    assert final.content[1].input == {"city": "Paris, France", "days": 3}
    assert final.content[1].id == "toolu_abc"


async def test_count_tokens_equals_usage_total() -> None:
    params: dict[str, Any] = {
        "model": "m",
        "system": [{"type": "text", "text": "You are terse. " * 40}],
        "tools": [WEATHER_TOOL],
        "messages": USER,
    }
    async with serve(TestModel(), min_cache_tokens=10) as (_, client):
        counted = await client.messages.count_tokens(**params)
        params["system"][0]["cache_control"] = {"type": "ephemeral"}
        cold = await client.messages.create(max_tokens=100, **params)
        warm = await client.messages.create(max_tokens=100, **params)
    for usage in (cold.usage, warm.usage):
        total = (
            usage.input_tokens
            + (usage.cache_read_input_tokens or 0)
            + (usage.cache_creation_input_tokens or 0)
        )
        assert total == counted.input_tokens
    assert (warm.usage.cache_read_input_tokens or 0) > 0


async def test_function_model_policy_sees_parsed_request() -> None:
    def answer(request: ModelRequest) -> str:
        return f"{len(request.messages)} messages, system={request.system[0].text}"

    async with serve(FunctionModel(answer)) as (_, client):
        message = await client.messages.create(
            model="m", max_tokens=50, system="be brief", messages=USER
        )
    assert message.content[0].type == "text"
    assert message.content[0].text == "1 messages, system=be brief"


async def test_scripted_policy_plays_in_order_then_fails_with_500() -> None:
    script = ScriptedPolicy(["one", ModelResponse(content=(TextBlock(text="two"),))])
    async with serve(script) as (srv, client):
        first = await client.messages.create(model="m", max_tokens=5, messages=USER)
        second = await client.messages.create(model="m", max_tokens=5, messages=USER)
        with pytest.raises(anthropic.InternalServerError):
            await client.messages.create(model="m", max_tokens=5, messages=USER)
    assert [first.content[0].text, second.content[0].text] == ["one", "two"]  # type: ignore[union-attr]
    assert script.remaining == 0
    assert srv.log[-1].status == 500
    assert "ScriptedPolicy" in (srv.log[-1].error_message or "")


async def test_policy_model_errors_become_api_errors() -> None:
    def limited(request: ModelRequest) -> str:
        raise RateLimitedError("slow down", retry_after=2.0)

    async with serve(FunctionModel(limited)) as (_, client):
        with pytest.raises(anthropic.RateLimitError) as caught:
            await client.messages.create(model="m", max_tokens=5, messages=USER)
    assert caught.value.response.headers["retry-after"] == "2"
    assert caught.value.type == "rate_limit_error"


async def test_prewarm_with_zero_max_tokens_returns_empty_content() -> None:
    policy = ScriptedPolicy([])
    async with serve(policy) as (_, client):
        message = await client.messages.create(model="m", max_tokens=0, messages=USER)
    assert message.content == []
    assert message.stop_reason == "max_tokens"
    assert policy.requests == []


async def test_missing_api_key_is_401_with_error_envelope() -> None:
    async with serve() as (srv, _):
        async with httpx2.AsyncClient(base_url=srv.base_url) as http:
            response = await http.post(
                "/v1/messages",
                headers={"anthropic-version": "2026-10-21"},
                json={"model": "m", "max_tokens": 10, "messages": USER},
            )
    body = response.json()
    assert response.status_code == 401
    assert body["type"] == "error"
    assert body["error"] == {
        "type": "authentication_error",
        "message": "x-api-key header is required",
    }
    assert body["request_id"] == response.headers["request-id"]


async def test_bearer_token_is_accepted_and_wrong_key_rejected_when_configured() -> None:
    async with MessagesServer(["ok"], api_key="right") as srv:
        good = anthropic.AsyncAnthropic(base_url=srv.base_url, auth_token="right", max_retries=0)
        bad = anthropic.AsyncAnthropic(base_url=srv.base_url, api_key="wrong", max_retries=0)
        try:
            message = await good.messages.create(model="m", max_tokens=5, messages=USER)
            with pytest.raises(anthropic.AuthenticationError):
                await bad.messages.create(model="m", max_tokens=5, messages=USER)
        finally:
            await good.close()
            await bad.close()
    assert message.content[0].type == "text"


async def test_unknown_path_is_404() -> None:
    async with serve() as (srv, _):
        async with httpx2.AsyncClient(base_url=srv.base_url) as http:
            response = await http.get("/v1/nothing", headers={"x-api-key": "k"})
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"


async def test_keep_alive_serves_many_requests_on_one_client() -> None:
    async with serve(TestModel()) as (srv, client):
        for _ in range(5):
            await client.messages.create(model="m", max_tokens=5, messages=USER)
    assert [r.status for r in srv.log] == [200] * 5


async def test_policy_connection_error_drops_the_connection() -> None:
    def unreachable(request: ModelRequest) -> str:
        raise ModelConnectionError("network is down")

    async with serve(FunctionModel(unreachable)) as (srv, client):
        with pytest.raises(anthropic.APIConnectionError):
            await client.messages.create(model="m", max_tokens=5, messages=USER)
    assert srv.log[0].status == 0


async def test_policy_answering_with_a_tool_result_is_a_server_error() -> None:
    bad = [ToolResultBlock(tool_use_id="toolu_1", content="not a model output")]
    async with serve([bad]) as (srv, client):
        with pytest.raises(anthropic.InternalServerError):
            await client.messages.create(model="m", max_tokens=5, messages=USER)
    assert srv.log[0].error_message == "the policy answered with a tool_result block"


async def test_concurrent_requests_are_served_independently() -> None:
    answers: dict[int, str] = {}

    async def ask(index: int) -> None:
        message = await client.messages.create(
            model="m", max_tokens=20, messages=[{"role": "user", "content": f"question {index}"}]
        )
        block = message.content[0]
        assert block.type == "text"
        answers[index] = block.text

    async with serve(TestModel()) as (srv, client):
        async with anyio.create_task_group() as group:
            for index in range(6):
                group.start_soon(ask, index)
    assert sorted(answers) == list(range(6))
    assert all(f"question {i}" in answers[i] for i in range(6))
    assert len({r.message_id for r in srv.log}) == 6


async def test_anthropic_version_header_is_required() -> None:
    async with serve() as (srv, _):
        async with httpx2.AsyncClient(base_url=srv.base_url) as http:
            response = await http.post(
                "/v1/messages",
                headers={"x-api-key": "k"},
                json={"model": "m", "max_tokens": 10, "messages": USER},
            )
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "anthropic-version: header is required"


async def test_answer_longer_than_max_tokens_is_cut() -> None:
    story = "The tide came in over the flat sand, slowly and then all at once. " * 20
    async with serve([story, story]) as (_, client):
        cut = await client.messages.create(model="m", max_tokens=30, messages=USER)
        async with client.messages.stream(model="m", max_tokens=30, messages=USER) as stream:
            streamed = await stream.get_final_message()
    for message in (cut, streamed):
        assert message.stop_reason == "max_tokens"
        assert message.usage.output_tokens == 30
        block = message.content[0]
        assert block.type == "text"
        assert story.startswith(block.text) and 0 < len(block.text) < len(story)


async def test_tool_use_that_does_not_fit_is_left_out() -> None:
    call = ToolUseBlock(id="toolu_big", name="get_weather", input={"city": "x" * 400, "days": 1})
    async with serve([[TextBlock(text="Checking."), call]]) as (_, client):
        message = await client.messages.create(
            model="m", max_tokens=40, messages=USER, tools=[WEATHER_TOOL]
        )
    assert message.stop_reason == "max_tokens"
    assert [b.type for b in message.content] == ["text"]
