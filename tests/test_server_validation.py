"""Request validation: the SDK raises BadRequestError carrying the real API's wording."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeAlias

import anthropic
import httpx2
import pytest

from anabranch.testing import MessagesServer, TestModel

pytestmark = pytest.mark.anyio

Wire: TypeAlias = Any
"""Request JSON sent as written, valid or not: the server's checks are what is tested, so
these are not typed as the SDK's params (which would refuse the invalid ones)."""

TOOL: Wire = {
    "name": "lookup",
    "description": "Look something up",
    "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
}


def text(value: str, **extra: Any) -> Wire:
    return {"type": "text", "text": value, **extra}


def use(call_id: str) -> Wire:
    return {"type": "tool_use", "id": call_id, "name": "lookup", "input": {"q": "x"}}


def result(call_id: str) -> Wire:
    return {"type": "tool_result", "tool_use_id": call_id, "content": "found"}


def user(*blocks: Wire) -> Wire:
    return {"role": "user", "content": list(blocks)}


def assistant(*blocks: Wire) -> Wire:
    return {"role": "assistant", "content": list(blocks)}


@asynccontextmanager
async def client_for(**options: Any) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with MessagesServer(TestModel(), **options) as srv:
        client = anthropic.AsyncAnthropic(base_url=srv.base_url, api_key="test", max_retries=0)
        try:
            yield client
        finally:
            await client.close()


async def rejection(messages: list[Wire], **params: Any) -> str:
    """The error message the server answers ``messages`` with (as the SDK reports it)."""
    async with client_for(**params.pop("server", {})) as client:
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(
                model="m", max_tokens=100, messages=messages, tools=[TOOL], **params
            )
    error = caught.value
    assert error.status_code == 400
    assert error.type == "invalid_request_error"
    assert error.request_id is not None and error.request_id.startswith("req_")
    assert isinstance(error.api_message, str)
    return error.api_message


async def test_tool_use_without_result_names_the_message_and_ids() -> None:
    message = await rejection(
        [user(text("go")), assistant(use("toolu_1"), use("toolu_2")), user(result("toolu_1"))]
    )
    assert message == (
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately "
        "after: toolu_2. Each `tool_use` block must have a corresponding `tool_result` "
        "block in the next message."
    )


async def test_dangling_tool_use_at_the_end_is_rejected() -> None:
    message = await rejection([user(text("go")), assistant(use("toolu_1"))])
    assert message.startswith("messages.1: `tool_use` ids were found without `tool_result`")


async def test_unexpected_tool_result_names_the_block() -> None:
    message = await rejection(
        [
            user(text("go")),
            assistant(use("toolu_1")),
            user(result("toolu_1"), result("toolu_ghost")),
        ]
    )
    assert message == (
        "messages.2.content.1: unexpected `tool_use_id` found in `tool_result` blocks: "
        "toolu_ghost. Each `tool_result` block must have a corresponding `tool_use` block "
        "in the previous message."
    )


async def test_tool_result_after_text_does_not_count_as_immediately_after() -> None:
    message = await rejection(
        [user(text("go")), assistant(use("toolu_1")), user(text("here:"), result("toolu_1"))]
    )
    assert message.startswith(
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately "
        "after: toolu_1."
    )


async def test_duplicate_tool_use_ids_are_rejected() -> None:
    message = await rejection(
        [
            user(text("go")),
            assistant(use("toolu_1")),
            user(result("toolu_1")),
            assistant(use("toolu_1")),
            user(result("toolu_1")),
        ]
    )
    assert message == "messages.3.content.0: `tool_use` ids must be unique"


async def test_first_message_must_be_user() -> None:
    message = await rejection([assistant(text("hello")), user(text("hi"))])
    assert message == 'messages: first message must use the "user" role'


async def test_roles_must_alternate() -> None:
    message = await rejection([user(text("a")), user(text("b"))])
    assert message == (
        'messages: roles must alternate between "user" and "assistant", '
        'but found multiple "user" roles in a row'
    )


async def test_empty_content_is_rejected_except_final_assistant() -> None:
    message = await rejection([user(text("a")), assistant(), user(text("b"))])
    assert message == (
        "messages.1: all messages must have non-empty content except for the optional "
        "final assistant message"
    )


async def test_at_most_four_cache_breakpoints() -> None:
    cached = {"type": "ephemeral"}
    message = await rejection([user(*(text(f"part {i}", cache_control=cached) for i in range(5)))])
    assert message == "A maximum of 4 blocks with cache_control may be provided. Found 5."


async def test_top_level_cache_control_uses_a_slot() -> None:
    cached = {"type": "ephemeral"}
    message = await rejection(
        [user(*(text(f"part {i}", cache_control=cached) for i in range(4)))],
        cache_control=cached,
    )
    assert message.endswith("Found 5.")


async def test_prompt_too_long_above_the_context_limit() -> None:
    message = await rejection([user(text("word " * 400))], server={"context_limit": 100})
    assert message.startswith("prompt is too long: ")
    assert message.endswith(" tokens > 100 maximum")
    tokens = int(message.split(": ")[1].split(" ")[0])
    assert tokens > 100


async def test_prompt_at_the_limit_is_accepted() -> None:
    async with client_for() as client:
        counted = await client.messages.count_tokens(
            model="m", messages=[user(text("word " * 400))]
        )
    async with client_for(context_limit=counted.input_tokens) as client:
        message = await client.messages.create(
            model="m", max_tokens=500, messages=[user(text("word " * 400))]
        )
    assert message.stop_reason == "end_turn"


async def test_tool_names_must_be_unique() -> None:
    async with client_for() as client:
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(
                model="m", max_tokens=10, messages=[user(text("a"))], tools=[TOOL, TOOL]
            )
    assert caught.value.api_message == "tools: Tool names must be unique."


async def test_count_tokens_validates_pairing_too() -> None:
    async with client_for() as client:
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.count_tokens(
                model="m", messages=[user(text("go")), assistant(use("toolu_9"))]
            )
    assert "toolu_9" in (caught.value.api_message or "")


async def test_shape_errors_use_field_paths() -> None:
    async with MessagesServer(TestModel()) as srv:
        async with httpx2.AsyncClient(base_url=srv.base_url) as http:
            headers = {"x-api-key": "k", "anthropic-version": "2026-10-21"}
            missing = await http.post(
                "/v1/messages", headers=headers, json={"model": "m", "messages": []}
            )
            extra = await http.post(
                "/v1/messages",
                headers=headers,
                json={"model": "m", "max_tokens": 5, "messages": [], "colour": "blue"},
            )
            bad_ttl = await http.post(
                "/v1/messages",
                headers=headers,
                json={
                    "model": "m",
                    "max_tokens": 5,
                    "messages": [user(text("a", cache_control={"type": "ephemeral", "ttl": "2h"}))],
                },
            )
    assert missing.json()["error"]["message"] == "max_tokens: Field required"
    assert extra.json()["error"]["message"] == "colour: Extra inputs are not permitted"
    assert bad_ttl.json()["error"]["message"] == (
        "messages.0.content.0.text.cache_control.ttl: Input should be '5m' or '1h'"
    )
    assert {r.status_code for r in (missing, extra, bad_ttl)} == {400}
    assert missing.headers["x-should-retry"] == "false"
