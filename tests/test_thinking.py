"""Extended thinking end to end: the real SDK against the local server, which is as strict
as the API about thinking blocks (signatures, the turn that must lead with thinking, the
budget and the settings thinking cannot be combined with)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import pydantic
import pytest

from anabranch import Agent, AnthropicModel, ModelSettings, RetryPolicy, Runtime, tool
from anabranch.messages import (
    Message,
    ModelRequest,
    RawBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
)
from anabranch.models._anthropic import _response_from_sdk, block_param
from anabranch.runtime._history import call_usage
from anabranch.testing import MessagesServer, TestModel, thinking_block

pytestmark = pytest.mark.anyio


@tool
def measure(depth: int) -> str:
    """Measure the tide at a depth in metres."""
    return f"tide at {depth} m: 1.2 m/s"


THINKER = Agent(
    name="thinker",
    model="claude-sonnet-5-5",
    instructions="Measure, then report.",
    tools=[measure],
    max_tokens=8_000,
    model_settings=ModelSettings(thinking_budget=2_048),
)


async def _run(tmp_path: Path, policy: Any, agent: Agent = THINKER) -> tuple[Any, Any, Any]:
    async with MessagesServer(policy) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        try:
            async with Runtime(
                db=tmp_path / "t.db", model=model, retry=RetryPolicy(max_attempts=1)
            ) as rt:
                result = await rt.run(agent, "How fast is the tide?")
                records = await rt.store.load_messages(result.run_id)
        finally:
            await model.aclose()
    return srv, result, records


async def test_tool_turns_with_thinking_round_trip_without_a_400(tmp_path: Path) -> None:
    srv, result, records = await _run(tmp_path, TestModel(rounds=3, redact_thinking=True))
    assert result.status == "done"
    ok = [r for r in srv.log if r.endpoint == "messages"]
    assert [r.status for r in ok] == [200, 200, 200, 200]
    # every request carried the thinking setting the agent asked for
    assert {r.request.settings.thinking_budget for r in ok} == {2_048}
    stored = [json.loads(r.content) for r in records if r.role == "assistant"]
    assert all(blocks[0]["type"] == "thinking" for blocks in stored)
    assert all(blocks[1]["type"] == "redacted_thinking" for blocks in stored)
    # each later request sent every earlier assistant turn back byte for byte
    for n, record in enumerate(ok[1:], start=1):
        sent = [m for m in record.request.messages if m.role == "assistant"]
        assert [m.model_dump(mode="json")["content"] for m in sent] == stored[:n]


async def test_thinking_usage_is_recorded(tmp_path: Path) -> None:
    _, result, _ = await _run(tmp_path, TestModel(rounds=1))
    assert 0 < result.usage.thinking_tokens < result.usage.output_tokens


def _client(srv: MessagesServer) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=srv.base_url, api_key="k", max_retries=0)


def _tool_turn(first: dict[str, Any] | None) -> list[dict[str, Any]]:
    use = {"type": "tool_use", "id": "toolu_1", "name": "measure", "input": {"depth": 1}}
    assistant = [first, use] if first else [use]
    return [
        {"role": "user", "content": "How fast?"},
        {"role": "assistant", "content": assistant},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "1"}],
        },
    ]


TOOLS = [{"name": "measure", "description": "m", "input_schema": {"type": "object"}}]
THINKING = {"type": "enabled", "budget_tokens": 1024}


async def _create(srv: MessagesServer, **body: Any) -> Any:
    client = _client(srv)
    try:
        return await client.messages.create(
            **{"model": "claude-haiku-4-5", "max_tokens": 2048, **body}
        )
    finally:
        await client.close()


async def _rejected(srv: MessagesServer, **body: Any) -> str:
    with pytest.raises(anthropic.BadRequestError) as caught:
        await _create(srv, **body)
    return str(caught.value.body["error"]["message"])  # type: ignore[index]


async def test_server_rejects_a_tool_turn_without_its_thinking() -> None:
    async with MessagesServer(TestModel()) as srv:
        message = await _rejected(srv, messages=_tool_turn(None), tools=TOOLS, thinking=THINKING)
    assert message.startswith(
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
        "`tool_use`. When `thinking` is enabled, a final `assistant` message must start with "
        "a thinking block"
    )


async def test_server_rejects_an_altered_signature_and_accepts_the_original() -> None:
    good = thinking_block("I should measure first.")
    altered = {
        "type": "thinking",
        "thinking": good.thinking + " (edited)",
        "signature": good.signature,
    }
    async with MessagesServer(TestModel()) as srv:
        message = await _rejected(srv, messages=_tool_turn(altered), tools=TOOLS, thinking=THINKING)
        accepted = await _create(
            srv, messages=_tool_turn(block_param(good)), tools=TOOLS, thinking=THINKING
        )
    assert message == "messages.1.content.0: Invalid `signature` in `thinking` block"
    assert accepted.content[0].type == "thinking"


@pytest.mark.parametrize(
    ("body", "wording"),
    [
        ({"max_tokens": 1024}, "`max_tokens` must be greater than `thinking.budget_tokens`"),
        ({"temperature": 0.3}, "`temperature` may only be set to 1 when thinking is enabled"),
        (
            {"tool_choice": {"type": "any"}},
            "Thinking may not be enabled when tool_choice forces tool use.",
        ),
    ],
)
async def test_server_rejects_what_thinking_cannot_be_combined_with(
    body: dict[str, Any], wording: str
) -> None:
    extra = {k: v for k, v in body.items() if k == "temperature"}
    rest = {k: v for k, v in body.items() if k != "temperature"}
    async with MessagesServer(TestModel()) as srv:
        message = await _rejected(
            srv,
            messages=[{"role": "user", "content": "hi"}],
            tools=TOOLS,
            thinking=THINKING,
            extra_body=extra or None,
            **rest,
        )
    assert message.startswith(wording)


async def test_streamed_thinking_and_signature_are_assembled() -> None:
    block = thinking_block("a long line of thought " * 30)
    policy = TestModel()

    async def answer(request: ModelRequest) -> Any:
        return [block, RedactedThinkingBlock(data="opaque"), TextBlock(text="done")]

    from anabranch.testing import FunctionModel

    async with MessagesServer(FunctionModel(answer)) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="k")
        try:
            response = await model.request(
                ModelRequest(
                    model="claude-haiku-4-5",
                    messages=(Message.user("think"),),
                    max_tokens=4000,
                    settings=ModelSettings(thinking_budget=1024),
                )
            )
        finally:
            await model.aclose()
    del policy
    assert response.content == (block, RedactedThinkingBlock(data="opaque"), TextBlock(text="done"))
    assert srv.log[-1].stream


def test_unknown_response_blocks_are_kept_and_sent_back_as_they_came() -> None:
    raw = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-5",
        "content": [
            {"type": "thinking", "thinking": "t", "signature": "s"},
            {
                "type": "server_tool_use",
                "id": "srvtoolu_1",
                "name": "web_search",
                "input": {"query": "q"},
            },
            {"type": "tool_use", "id": "toolu_1", "name": "measure", "input": {"depth": 2}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 3,
            "output_tokens": 9,
            "output_tokens_details": {"thinking_tokens": 4},
        },
    }
    message = anthropic.types.Message.model_validate(raw)
    response = _response_from_sdk(message)
    assert [b.type for b in response.content] == ["thinking", "raw", "tool_use"]
    assert isinstance(response.content[1], RawBlock)
    assert [block_param(b) for b in response.content] == raw["content"]
    assert response.usage.thinking_tokens == 4
    assert isinstance(response.content[2], ToolUseBlock)
    assert isinstance(response.content[0], ThinkingBlock)


def test_agent_refuses_settings_the_api_refuses() -> None:
    with pytest.raises(
        pydantic.ValidationError,
        match=r"max_tokens \(2048\) must be greater than model_settings.thinking_budget \(2048\)",
    ):
        Agent(name="a", max_tokens=2048, model_settings=ModelSettings(thinking_budget=2048))
    with pytest.raises(pydantic.ValidationError, match="temperature"):
        ModelSettings(thinking_budget=2048, temperature=0.2)
    with pytest.raises(pydantic.ValidationError, match="top_k"):
        ModelSettings(thinking_budget=2048, top_k=5)
    with pytest.raises(pydantic.ValidationError, match="forces tool use"):
        ModelSettings(thinking_budget=2048, tool_choice="any")
    with pytest.raises(pydantic.ValidationError, match="names no tool"):
        Agent(name="a", model_settings=ModelSettings(tool_choice="nope"))
    with pytest.raises(pydantic.ValidationError, match="greater than or equal to 1024"):
        ModelSettings(thinking_budget=100)
    assert ModelSettings(thinking_budget=2048, temperature=1.0, top_p=0.97).thinking


async def test_thinking_runs_read_the_cache_and_survive_a_mid_stream_error(tmp_path: Path) -> None:
    async with MessagesServer(TestModel(rounds=3), min_cache_tokens=0) as srv:
        srv.inject("stream_error")  # the first answer breaks off mid-stream (HTTP 200)
        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        try:
            async with Runtime(
                db=tmp_path / "c.db",
                model=model,
                retry=RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02),
            ) as rt:
                result = await rt.run(THINKER, "How fast is the tide?")
                calls = [c for c in await rt.store.session_calls(result.session_id)]
                breaks = await rt.store.list_cache_breaks(result.session_id)
        finally:
            await model.aclose()
    assert result.status == "done"
    assert [c.status for c in calls] == ["error", "ok", "ok", "ok", "ok"]
    reads = [call_usage(c).cache_read_input_tokens for c in calls[2:]]
    assert all(read > 0 for read in reads)  # thinking blocks keep the prefix stable
    assert breaks == []


def test_thinking_tokens_are_priced_as_output() -> None:
    from anabranch.context._pricing import PriceTable
    from anabranch.messages import Usage

    usage = Usage(input_tokens=1000, output_tokens=900, thinking_tokens=600)
    cost = PriceTable().cost("claude-sonnet-5-5", usage)
    assert cost is not None
    assert cost.output == pytest.approx(900 * 10 / 1_000_000)
    assert (usage + usage).thinking_tokens == 1200
