"""Prompt-cache accounting as seen through the SDK's usage fields."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anthropic
import pytest
from anthropic.types import Usage
from hypothesis import given, settings
from hypothesis import strategies as st

from anabranch.context._tokens import estimate_request
from anabranch.messages import ModelRequest, SystemBlock, ToolDefinition
from anabranch.testing import ManualClock, MessagesServer, TestModel
from anabranch.testing._cache import PromptCache, prefix_blocks
from anabranch.testing._wire import parse_body

EPHEMERAL: dict[str, Any] = {"type": "ephemeral"}
ONE_HOUR: dict[str, Any] = {"type": "ephemeral", "ttl": "1h"}
TOOL_DESCRIPTION = "Search the product manual for a phrase. " * 20
SYSTEM = "You answer questions about the product manual precisely. " * 20


def tool(cache: dict[str, Any] | None = None) -> dict[str, Any]:
    definition: dict[str, Any] = {
        "name": "search",
        "description": TOOL_DESCRIPTION,
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
    if cache:
        definition["cache_control"] = cache
    return definition


def system(value: str = SYSTEM, cache: dict[str, Any] | None = EPHEMERAL) -> list[dict[str, Any]]:
    block: dict[str, Any] = {"type": "text", "text": value}
    if cache:
        block["cache_control"] = cache
    return [block]


def turn(role: str, value: str, cache: dict[str, Any] | None = None) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": value}
    if cache:
        block["cache_control"] = cache
    return {"role": role, "content": [block]}


def tools_tokens() -> int:
    definition = ToolDefinition(
        name="search",
        description=TOOL_DESCRIPTION,
        input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
    )
    return estimate_request(ModelRequest(model="m", tools=(definition,), messages=()))


def system_tokens(value: str = SYSTEM) -> int:
    return estimate_request(ModelRequest(model="m", system=(SystemBlock(text=value),), messages=()))


def total(usage: Usage) -> int:
    return (
        usage.input_tokens
        + (usage.cache_read_input_tokens or 0)
        + (usage.cache_creation_input_tokens or 0)
    )


@asynccontextmanager
async def cached_server(
    **options: Any,
) -> AsyncIterator[tuple[MessagesServer, anthropic.AsyncAnthropic]]:
    options.setdefault("min_cache_tokens", 100)
    async with MessagesServer(TestModel(), **options) as srv:
        client = anthropic.AsyncAnthropic(base_url=srv.base_url, api_key="test", max_retries=0)
        try:
            yield srv, client
        finally:
            await client.close()


async def ask(client: anthropic.AsyncAnthropic, model: str = "m", **params: Any) -> Usage:
    message = await client.messages.create(model=model, max_tokens=100, **params)
    usage: Usage = message.usage
    return usage


@pytest.mark.anyio
async def test_second_identical_request_reads_the_cache() -> None:
    params: dict[str, Any] = {
        "system": system(),
        "messages": [turn("user", "Where is the reset button?")],
    }
    async with cached_server() as (srv, client):
        first = await ask(client, **params)
        second = await ask(client, **params)
        counted = await client.messages.count_tokens(model="m", **params)
    assert first.cache_read_input_tokens == 0
    assert first.cache_creation_input_tokens == system_tokens()
    assert first.cache_creation is not None
    assert first.cache_creation.ephemeral_5m_input_tokens == system_tokens()
    assert second.cache_read_input_tokens == system_tokens()
    assert second.cache_creation_input_tokens == 0
    assert total(first) == total(second) == counted.input_tokens
    assert srv.log[1].cache_read_input_tokens == system_tokens()


@pytest.mark.anyio
async def test_below_minimum_length_nothing_is_cached() -> None:
    params: dict[str, Any] = {
        "system": system("Be brief."),
        "messages": [turn("user", "hi", EPHEMERAL)],
    }
    async with cached_server(min_cache_tokens=1024) as (_, client):
        first = await ask(client, **params)
        second = await ask(client, **params)
    for usage in (first, second):
        assert usage.cache_creation_input_tokens == 0
        assert usage.cache_read_input_tokens == 0
        assert usage.input_tokens == total(usage)


@pytest.mark.anyio
async def test_system_change_keeps_tools_cache_only() -> None:
    messages = [turn("user", "Where is the reset button? " * 5, EPHEMERAL)]
    async with cached_server() as (_, client):
        await ask(client, tools=[tool(EPHEMERAL)], system=system(), messages=messages)
        changed = await ask(
            client, tools=[tool(EPHEMERAL)], system=system(SYSTEM + " Today."), messages=messages
        )
    assert changed.cache_read_input_tokens == tools_tokens()
    assert changed.cache_creation_input_tokens == total(changed) - tools_tokens()


@pytest.mark.anyio
async def test_message_change_keeps_tools_and_system() -> None:
    async with cached_server() as (_, client):
        await ask(
            client,
            tools=[tool(EPHEMERAL)],
            system=system(),
            messages=[turn("user", "first question " * 10, EPHEMERAL)],
        )
        changed = await ask(
            client,
            tools=[tool(EPHEMERAL)],
            system=system(),
            messages=[turn("user", "another question " * 10, EPHEMERAL)],
        )
    both = estimate_request(
        ModelRequest(
            model="m",
            tools=(
                ToolDefinition(
                    name="search",
                    description=TOOL_DESCRIPTION,
                    input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
                ),
            ),
            system=(SystemBlock(text=SYSTEM),),
            messages=(),
        )
    )
    assert changed.cache_read_input_tokens == both
    assert (changed.cache_creation_input_tokens or 0) > 0


@pytest.mark.anyio
async def test_model_switch_misses_everything() -> None:
    params: dict[str, Any] = {
        "tools": [tool(EPHEMERAL)],
        "system": system(),
        "messages": [turn("user", "hi")],
    }
    async with cached_server() as (_, client):
        first = await ask(client, model="model-a", **params)
        other = await ask(client, model="model-b", **params)
        again = await ask(client, model="model-a", **params)
    assert other.cache_read_input_tokens == 0
    assert other.cache_creation_input_tokens == first.cache_creation_input_tokens
    assert (other.cache_creation_input_tokens or 0) > 0
    assert again.cache_read_input_tokens == first.cache_creation_input_tokens


@pytest.mark.anyio
async def test_intermediate_breakpoint_bridges_a_turn_longer_than_the_lookback() -> None:
    long_text = "Read this long document carefully. " * 30
    notes = [text_block(f"note {i}") for i in range(25)]
    async with cached_server() as (_, client):
        first = await ask(client, messages=[turn("user", long_text, EPHEMERAL)])
        notes[10] = {**notes[10], "cache_control": EPHEMERAL}
        bridged = await ask(
            client,
            messages=[
                turn("user", long_text),
                {"role": "assistant", "content": notes},
                turn("user", "next", EPHEMERAL),
            ],
        )
    assert first.cache_creation_input_tokens == total(first)
    assert bridged.cache_read_input_tokens == first.cache_creation_input_tokens
    assert bridged.cache_creation_input_tokens == total(bridged) - total(first)


@pytest.mark.anyio
async def test_ttl_expires_and_hits_refresh_it() -> None:
    clock = ManualClock()
    params: dict[str, Any] = {"system": system(), "messages": [turn("user", "hello")]}
    async with cached_server(clock=clock) as (_, client):
        await ask(client, **params)
        clock.advance(299)
        refreshed = await ask(client, **params)
        clock.advance(299)  # 598 s after the write, 299 s after the refreshing hit
        still = await ask(client, **params)
        clock.advance(301)
        expired = await ask(client, **params)
    assert refreshed.cache_read_input_tokens == system_tokens()
    assert still.cache_read_input_tokens == system_tokens()
    assert expired.cache_read_input_tokens == 0
    assert expired.cache_creation_input_tokens == system_tokens()


@pytest.mark.anyio
async def test_one_hour_entries_outlive_five_minutes_and_bill_separately() -> None:
    clock = ManualClock()
    params: dict[str, Any] = {
        "system": system(cache=ONE_HOUR),
        "messages": [turn("user", "What does chapter two say? " * 10, EPHEMERAL)],
    }
    async with cached_server(clock=clock) as (_, client):
        first = await ask(client, **params)
        clock.advance(1800)
        later = await ask(client, **params)
    assert first.cache_creation is not None
    assert first.cache_creation.ephemeral_1h_input_tokens == system_tokens()
    assert first.cache_creation.ephemeral_5m_input_tokens == total(first) - system_tokens()
    assert later.cache_read_input_tokens == system_tokens()
    assert later.cache_creation is not None
    assert later.cache_creation.ephemeral_5m_input_tokens == total(later) - system_tokens()


@pytest.mark.anyio
async def test_top_level_cache_control_caches_the_whole_prompt() -> None:
    params: dict[str, Any] = {"messages": [turn("user", "A long question about the manual. " * 20)]}
    async with cached_server() as (_, client):
        first = await ask(client, cache_control=EPHEMERAL, **params)
        second = await ask(client, cache_control=EPHEMERAL, **params)
    assert first.cache_creation_input_tokens == total(first)
    assert second.cache_read_input_tokens == total(second)


@pytest.mark.anyio
async def test_streaming_usage_carries_cache_counts() -> None:
    params: dict[str, Any] = {"system": system(), "messages": [turn("user", "hello")]}
    async with cached_server() as (_, client):
        await ask(client, **params)
        async with client.messages.stream(model="m", max_tokens=50, **params) as stream:
            final = await stream.get_final_message()
    assert final.usage.cache_read_input_tokens == system_tokens()


@pytest.mark.anyio
@pytest.mark.parametrize(("notes", "hit"), [(19, True), (20, False)])
async def test_lookback_boundary_is_twenty_blocks_back(notes: int, hit: bool) -> None:
    long_text = "Read this long document carefully. " * 30
    between = {"role": "assistant", "content": [text_block(f"note {i}") for i in range(notes)]}
    async with cached_server() as (_, client):
        first = await ask(client, messages=[turn("user", long_text, EPHEMERAL)])
        later = await ask(
            client,
            messages=[turn("user", long_text), between, turn("user", "next", EPHEMERAL)],
        )
    expected = first.cache_creation_input_tokens if hit else 0
    assert later.cache_read_input_tokens == expected


def text_block(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


# -- property: the parts of the prompt always add up -----------------------------------

words = st.text(alphabet="abcdefgh ", min_size=1, max_size=300).filter(str.strip)
maybe_cache = st.sampled_from([None, EPHEMERAL, ONE_HOUR])


@st.composite
def wire_requests(draw: st.DrawFn) -> dict[str, Any]:
    cached_blocks = 0

    def mark() -> dict[str, Any] | None:
        nonlocal cached_blocks
        control = draw(maybe_cache) if cached_blocks < 4 else None
        cached_blocks += control is not None
        return control

    messages = []
    for index in range(draw(st.integers(1, 4)) * 2 - 1):
        blocks = []
        for _ in range(draw(st.integers(1, 3))):
            block: dict[str, Any] = {"type": "text", "text": draw(words)}
            if control := mark():
                block["cache_control"] = control
            blocks.append(block)
        messages.append({"role": "user" if index % 2 == 0 else "assistant", "content": blocks})
    system_block: dict[str, Any] = {"type": "text", "text": draw(words)}
    if control := mark():
        system_block["cache_control"] = control
    return {
        "model": draw(st.sampled_from(["model-a", "model-b"])),
        "max_tokens": 10,
        "system": [system_block],
        "messages": messages,
    }


@settings(max_examples=60, deadline=None)
@given(st.lists(wire_requests(), min_size=1, max_size=6), st.integers(0, 400))
def test_input_read_and_write_always_add_up_to_the_count(
    bodies: list[dict[str, Any]], min_tokens: int
) -> None:
    cache = PromptCache(min_tokens=min_tokens, clock=ManualClock())
    for body in bodies + bodies:  # the second pass can hit what the first wrote
        wire = parse_body(json.dumps(body).encode())
        counted = estimate_request(wire.request)
        blocks = prefix_blocks(wire.request, wire.cache_marks, salt=wire.salt)
        usage = cache.account(wire.request.model, blocks, counted)
        assert usage.total_input_tokens == counted
        assert min(usage.input_tokens, usage.cache_read_input_tokens) >= 0
        assert (
            usage.cache_creation_5m_input_tokens + usage.cache_creation_1h_input_tokens
            == usage.cache_creation_input_tokens
            >= 0
        )
        if usage.cache_creation_input_tokens:
            assert usage.cache_read_input_tokens + usage.cache_creation_input_tokens >= min_tokens
