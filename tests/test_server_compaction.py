"""Compaction on demand (beta ``compact-2026-09-04``) in the local server, through the real
SDK: the ``compaction`` parameter returns one signed ``compaction`` block
(``stop_reason: "compaction"``); the block opens later requests in place of what it
summarized; kept turns that follow it unchanged keep valid thinking on a model with
preserved thinking; malformed, moved or altered blocks, and a missing beta, are refused."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from anabranch.testing import MessagesServer, TestModel

pytestmark = pytest.mark.anyio

MODEL = "claude-opus-5-5"
BETA = "compact-2026-09-04"
SYSTEM = "You measure tides."
TOOLS: list[Any] = [{"name": "measure", "description": "m", "input_schema": {"type": "object"}}]


def _client(srv: MessagesServer) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=srv.base_url, api_key="k", max_retries=0)


async def _create(srv: MessagesServer, messages: list[Any], **body: Any) -> Any:
    client = _client(srv)
    try:
        params = {"model": MODEL, "max_tokens": 4096, "system": SYSTEM, "tools": TOOLS, **body}
        return await client.beta.messages.create(messages=messages, betas=[BETA], **params)
    finally:
        await client.close()


def _param(answer: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": [b.to_dict() for b in answer.content]}


def _results(answer: Any) -> dict[str, Any]:
    uses = [b for b in answer.content if b.type == "tool_use"]
    return {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": u.id, "content": "1.2 m/s"} for u in uses
        ],
    }


async def _conversation(srv: MessagesServer) -> tuple[list[Any], Any]:
    """Two tool turns: the messages of the second request, and its reply."""
    messages: list[Any] = [{"role": "user", "content": "How fast is the tide?"}]
    first = await _create(srv, messages)
    messages += [_param(first), _results(first)]
    second = await _create(srv, messages)
    return messages, second


async def test_a_compaction_request_returns_one_signed_block_and_kept_thinking_stays_valid() -> (
    None
):
    async with MessagesServer(TestModel(rounds=4)) as srv:
        messages, reply = await _conversation(srv)
        compacted = await _create(srv, messages, compaction={"type": "summarize"})
        block = compacted.content[0].to_dict()
        # the block stands in place of the summarized messages; the kept turns (the reply
        # to that request and its results) follow it unchanged, thinking included
        after = [{"role": "user", "content": [block]}, _param(reply), _results(reply)]
        answer = await _create(srv, after)
        with pytest.raises(anthropic.BadRequestError) as other_system:
            await _create(srv, after, system="You measure tides carefully.")
    assert compacted.stop_reason == "compaction"
    assert [b.type for b in compacted.content] == ["compaction"]
    assert block["content"] and block["signature"]
    assert reply.content[0].type == "thinking"
    assert answer.content
    assert "bound to a different conversation" in other_system.value.body["error"]["message"]  # type: ignore[index]


async def test_a_streamed_compaction_block_is_assembled() -> None:
    async with MessagesServer(TestModel(rounds=4)) as srv:
        messages, _ = await _conversation(srv)
        client = _client(srv)
        try:
            async with client.beta.messages.stream(
                model=MODEL, max_tokens=4096, system=SYSTEM, tools=TOOLS, messages=messages,
                betas=[BETA], compaction={"type": "summarize", "instructions": "Keep numbers."},
            ) as stream:  # fmt: skip
                final = await stream.get_final_message()
        finally:
            await client.close()
        plain = await _create(srv, messages, compaction={"type": "summarize"})
    assert final.stop_reason == "compaction"
    assert final.content[0].type == "compaction"
    assert final.content[0].content and final.content[0].signature
    assert plain.content[0].content


async def _refused(srv: MessagesServer, messages: list[Any], **body: Any) -> str:
    with pytest.raises(anthropic.BadRequestError) as caught:
        await _create(srv, messages, **body)
    return str(caught.value.body["error"]["message"])  # type: ignore[index]


async def test_malformed_moved_or_altered_compaction_blocks_are_refused() -> None:
    async with MessagesServer(TestModel(rounds=4)) as srv:
        messages, reply = await _conversation(srv)
        compacted = await _create(srv, messages, compaction={"type": "summarize"})
        block = compacted.content[0].to_dict()
        kept = [_param(reply), _results(reply)]
        altered = {**block, "content": block["content"] + " (edited)"}
        # the SDK's tool runner sends the block as the assistant message it came in: accepted
        as_returned = await _create(srv, [{"role": "assistant", "content": [block]}, *kept])
        wrong_role = await _refused(
            srv, [{"role": "user", "content": [block]}, {"role": "user", "content": "go on"}]
        )
        edited = await _refused(srv, [{"role": "user", "content": [altered]}, *kept])
        empty = await _refused(
            srv, [{"role": "user", "content": [{**block, "content": ""}]}, *kept]
        )
        moved = await _refused(
            srv, [messages[0], {"role": "assistant", "content": [block]}, messages[0]]
        )
        bad_type = await _refused(srv, messages, compaction={"type": "compress"})
        client = _client(srv)
        try:
            with pytest.raises(anthropic.BadRequestError) as no_beta:
                await client.messages.create(
                    model=MODEL, max_tokens=4096, messages=messages, tools=TOOLS,
                    extra_body={"compaction": {"type": "summarize"}},
                )  # fmt: skip
        finally:
            await client.close()
    assert as_returned.content
    assert "has the role" in wrong_role
    assert edited == "messages.0.content.0: Invalid `signature` in `compaction` block"
    assert "compaction content cannot be empty" in empty
    assert "must be the first block of the first message" in moved
    assert "compaction.type: Input should be 'summarize'" in bad_type
    assert f"require the `anthropic-beta: {BETA}` header" in no_beta.value.body["error"]["message"]  # type: ignore[index]
