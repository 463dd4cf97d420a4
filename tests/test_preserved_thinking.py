"""Preserved thinking and adaptive thinking, through the real SDK against the local server.

On Opus 5.5 / Fable 5.1 / Sonnet 5.5 ... a thinking block is bound to its prefix (system,
tools, every earlier message): replayed after any of them changed it is a 400 ("bound to a
different conversation"), or dropped with ``prefix_mismatch_behavior: "drop_block"``. The
server is that strict; the runtime never sends such a request, also after compactions and
after a resume. Adaptive thinking is the only mode of some models, refused by older ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import anyio
import pytest

from anabranch import Agent, AnthropicModel, ModelSettings, RetryPolicy, Runtime
from anabranch.messages import ModelRequest
from anabranch.testing import MessagesServer, TestModel
from anabranch.testing._models import is_summary_request
from tests.compaction_helpers import fetch, small_policy

pytestmark = pytest.mark.anyio

TOOLS = [{"name": "measure", "description": "m", "input_schema": {"type": "object"}}]


def _client(srv: MessagesServer) -> Any:
    """The real SDK's client (typed ``Any``: these tests send raw JSON shapes)."""
    return anthropic.AsyncAnthropic(base_url=srv.base_url, api_key="k", max_retries=0)


async def _first_turn(srv: MessagesServer, model: str, system: str) -> tuple[list[Any], Any]:
    """One tool turn: the messages to send back with its result, and the answer."""
    client = _client(srv)
    try:
        messages: list[Any] = [{"role": "user", "content": "How fast is the tide?"}]
        answer = await client.messages.create(
            model=model, max_tokens=4096, system=system, tools=TOOLS, messages=messages,
            thinking={"type": "adaptive"},
        )  # fmt: skip
    finally:
        await client.close()
    use = next(b for b in answer.content if b.type == "tool_use")
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "1.2 m/s"}
    return [
        *messages,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]},
        {"role": "user", "content": [result]},
    ], answer


async def _send(srv: MessagesServer, model: str, system: str, **body: Any) -> Any:
    client = _client(srv)
    try:
        return await client.messages.create(
            model=model, max_tokens=4096, system=system,
            **{"tools": TOOLS, "thinking": {"type": "adaptive"}, **body},
        )  # fmt: skip
    finally:
        await client.close()


BOUND = "claude-opus-5-5"


async def test_a_replayed_block_is_accepted_only_after_the_prefix_it_was_produced_after() -> None:
    async with MessagesServer(TestModel(rounds=2)) as srv:
        messages, first = await _first_turn(srv, BOUND, "You measure tides.")
        assert first.content[0].type == "thinking"
        ok = await _send(srv, BOUND, "You measure tides.", messages=messages)
        with pytest.raises(anthropic.BadRequestError) as system_changed:
            await _send(srv, BOUND, "You measure tides carefully.", messages=messages)
        edited = [{**messages[0], "content": "How fast is the tide today?"}, *messages[1:]]
        with pytest.raises(anthropic.BadRequestError) as message_changed:
            await _send(srv, BOUND, "You measure tides.", messages=edited)
        with pytest.raises(anthropic.BadRequestError) as tools_changed:
            await _send(srv, BOUND, "You measure tides.", messages=messages, tools=[
                {**TOOLS[0], "description": "measure the tide"}
            ])  # fmt: skip
        drop = {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop_block"}}
        dropped = await _send(
            srv, BOUND, "You measure tides carefully.", messages=messages, thinking=drop
        )
    assert ok.stop_reason in ("tool_use", "end_turn")
    wording = (
        "messages.1.content.0: Invalid `signature` in `thinking` block. The block is bound to "
        "a different conversation. Remove the block, or set "
        '`thinking.block_binding.prefix_mismatch_behavior` to "drop_block".'
    )
    for caught in (system_changed, message_changed, tools_changed):
        assert caught.value.body["error"]["message"] == wording  # type: ignore[index]
    assert dropped.content
    # with drop_block the model saw the turn without the thinking that no longer fits
    assert srv.log[-1].dropped_thinking == ("messages.1.content.0",)


async def test_models_without_preserved_thinking_do_not_bind_blocks_to_the_prefix() -> None:
    async with MessagesServer(TestModel(rounds=2)) as srv:
        messages, _ = await _first_turn(srv, "claude-opus-4-6", "You measure tides.")
        answer = await _send(srv, "claude-opus-4-6", "Another system prompt.", messages=messages)
    assert answer.content


@pytest.mark.parametrize(
    ("model", "thinking", "wording"),
    [
        (
            "claude-opus-5-5",
            {"type": "enabled", "budget_tokens": 2048},
            '"thinking.type.enabled" is not supported for this model. Use '
            '"thinking.type.adaptive" and "output_config.effort" to control thinking behavior.',
        ),
        (
            "claude-haiku-4-5",
            {"type": "adaptive"},
            "adaptive thinking is not supported on this model",
        ),
        ("claude-fable-5-1", {"type": "disabled"}, '"thinking.type.disabled" is not supported'),
    ],
)
async def test_the_server_refuses_the_thinking_modes_a_model_does_not_accept(
    model: str, thinking: dict[str, Any], wording: str
) -> None:
    async with MessagesServer(TestModel()) as srv:
        with pytest.raises(anthropic.BadRequestError) as caught:
            await _send(
                srv, model, "s", messages=[{"role": "user", "content": "hi"}], thinking=thinking
            )
    assert caught.value.body["error"]["message"].startswith(wording)  # type: ignore[index]


async def test_always_thinking_models_think_without_the_parameter_and_refuse_forced_tools() -> None:
    async with MessagesServer(TestModel()) as srv:
        client = _client(srv)
        try:
            plain = await client.messages.create(
                model="claude-fable-5-1", max_tokens=2048,
                messages=[{"role": "user", "content": "hi"}],
            )  # fmt: skip
            with pytest.raises(anthropic.BadRequestError) as forced:
                await client.messages.create(
                    model="claude-fable-5-1", max_tokens=2048, tools=TOOLS,
                    tool_choice={"type": "any"}, messages=[{"role": "user", "content": "hi"}],
                )  # fmt: skip
        finally:
            await client.close()
    assert plain.content[0].type == "thinking"
    assert "tool_choice forces tool use" in forced.value.body["error"]["message"]  # type: ignore[index]


def test_adaptive_thinking_is_validated_at_definition() -> None:
    assert ModelSettings(thinking="adaptive").thinking == "adaptive"
    assert ModelSettings(thinking_budget=2048).thinking == "enabled"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"thinking": "adaptive", "thinking_budget": 2048}, "takes no thinking_budget"),
        ({"thinking": "enabled"}, "needs a thinking_budget"),
        ({"thinking": "adaptive", "top_k": 5}, "cannot be combined with top_k"),
    ]
    for settings, wording in cases:
        with pytest.raises(ValueError, match=wording):
            ModelSettings(**settings)
    with pytest.raises(ValueError, match="accepts only adaptive thinking"):
        Agent(name="a", model="claude-opus-5-5", max_tokens=4096,
              model_settings=ModelSettings(thinking_budget=2048))  # fmt: skip
    with pytest.raises(ValueError, match="does not support adaptive thinking"):
        Agent(name="a", model="claude-haiku-4-5", model_settings=ModelSettings(thinking="adaptive"))
    with pytest.raises(ValueError, match="always thinks"):
        Agent(name="a", model="claude-fable-5-1", model_settings=ModelSettings(tool_choice="any"))


def _thinker(model: str, settings: ModelSettings) -> Agent:
    return Agent(
        name="thinker",
        model=model,
        instructions="Research the topic with your tools, then report.",
        tools=[fetch],
        context=small_policy(window=2500, output_reserve=300),
        max_tokens=2048,
        max_turns=60,
        model_settings=settings,
    )


FAMILIES = [
    pytest.param("claude-opus-5-5", ModelSettings(thinking="adaptive"), id="prefix-bound"),
    pytest.param("claude-haiku-4-5", ModelSettings(thinking_budget=1024), id="classic"),
]


def _turns(srv: MessagesServer) -> list[ModelRequest]:
    log = [r for r in srv.log if r.endpoint == "messages" and r.request is not None]
    return [r.request for r in log if r.request is not None and not is_summary_request(r.request)]


@pytest.mark.parametrize(("model", "settings"), FAMILIES)
async def test_a_compacting_thinking_agent_never_sends_a_block_the_api_refuses(
    tmp_path: Path, model: str, settings: ModelSettings
) -> None:
    agent = _thinker(model, settings)
    async with MessagesServer(TestModel(rounds=20)) as srv:
        client = AnthropicModel(base_url=srv.base_url, api_key="k")
        try:
            async with Runtime(
                db=tmp_path / "t.db", model=client, retry=RetryPolicy(max_attempts=1)
            ) as rt:
                with anyio.fail_after(120):
                    result = await rt.run(agent, "Study the tides.")
                compactions = await rt.store.count_boundaries(result.run_id, "ok")
        finally:
            await client.aclose()
    assert result.status == "done", result.error
    assert compactions >= 2
    log = [r for r in srv.log if r.endpoint == "messages"]
    assert [r.error_message for r in log if r.status != 200] == []
    turns = _turns(srv)
    tool_turns = [q for q in turns if q.messages[-1].tool_results]
    if model == "claude-haiku-4-5":
        # no prefix binding: the open tool turn keeps its thinking through every compaction
        assert all(q.messages[-2].content[0].type == "thinking" for q in tool_turns)
    else:
        # bound: the turns made before a compaction lose their thinking in later requests,
        # the ones made since keep theirs, byte for byte
        stripped = [q for q in tool_turns if q.messages[-2].content[0].type != "thinking"]
        kept = [q for q in tool_turns if q.messages[-2].content[0].type == "thinking"]
        assert stripped and kept
    assert sum(1 for q in turns for m in q.messages if m.thinking_blocks) > 0
