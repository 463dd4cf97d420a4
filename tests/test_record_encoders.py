"""The per-call records written out directly give the very bytes the general encoders give
(what the store held before they were written out keeps comparing equal)."""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from anabranch.context._tokens import estimate_messages, estimate_request, message_tokens
from anabranch.messages import (
    Image,
    Message,
    ModelRequest,
    ModelSettings,
    SystemBlock,
    TextBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
    canonical_json,
    message_content_json,
    message_digest,
)
from anabranch.runtime._history import TOOL_EVENT_REF, message_json, usage_json

_PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def test_usage_json_is_the_canonical_json_of_the_counts_that_are_not_zero() -> None:
    fields = list(Usage.model_fields)
    for values in itertools.product((0, 1, 12_345), repeat=3):
        for offset in range(len(fields)):
            counts = {fields[(offset + i) % len(fields)]: v for i, v in enumerate(values)}
            usage = Usage(**counts)
            expected = canonical_json(usage.model_dump(mode="json", exclude_defaults=True))
            assert usage_json(usage) == expected
    assert usage_json(Usage()) == "{}"
    negative = Usage(input_tokens=-3, output_tokens=7)
    assert usage_json(negative) == '{"input_tokens":-3,"output_tokens":7}'
    odd = Usage().model_copy(update={"output_tokens": True})  # not an int: the general path
    assert usage_json(odd) == canonical_json(odd.model_dump(mode="json", exclude_defaults=True))


def _stored(message: Message, committed: dict[str, ToolResultBlock]) -> str:
    """What ``message_json`` stores, by its definition: the message's canonical JSON with
    each result equal to its committed one replaced by a reference."""
    content: list[Any] = message.model_dump(mode="json")["content"]
    for index, block in enumerate(message.content):
        if isinstance(block, ToolResultBlock) and committed.get(block.tool_use_id) == block:
            content[index] = {
                "type": "tool_result",
                "tool_use_id": block.tool_use_id,
                "ref": TOOL_EVENT_REF,
            }
    return canonical_json(content)


def test_message_json_with_committed_results_is_the_reference_form() -> None:
    first = ToolResultBlock(tool_use_id='call "é" 1', content="one")
    second = ToolResultBlock(tool_use_id="call_2", content="two", is_error=True)
    pictured = ToolResultBlock(
        tool_use_id="call_3",
        content="three",
        attachments=(Image(data=_PNG, media_type="image/png"),),
    )
    committed = {b.tool_use_id: b for b in (first, second, pictured)}
    equal = ToolResultBlock(tool_use_id="call_2", content="two", is_error=True)  # a new object
    changed = ToolResultBlock(tool_use_id="call_2", content="two, cut")
    for content in [
        (first, second, pictured),  # every block as committed
        (first, equal),
        (first, changed),  # one as committed, one changed on the way in
        (changed, first),  # the changed one first
        (first, ToolResultBlock(tool_use_id="call_9", content="not committed")),
        (changed, TextBlock(text="note")),  # none as committed
        (first, TextBlock(text="limits: 3 turns left")),
        (),
    ]:
        message = Message(role="user", content=content)
        assert message_json(message, committed) == _stored(message, committed)
        assert message_json(message) == _stored(message, {})
    answer = Message(
        role="assistant", content=(ToolUseBlock(id="call_2", name="n", input={"a": 1}),)
    )
    assert message_json(answer, committed) == _stored(answer, {})


def test_the_usual_settings_key_and_default_check_are_the_general_ones() -> None:
    for settings in [
        ModelSettings(),
        ModelSettings(tool_choice="auto"),
        ModelSettings(thinking_budget=2048),
        ModelSettings(thinking="adaptive"),
        ModelSettings(temperature=0.5),
        ModelSettings(extra_headers={"x": "y"}),
    ]:
        if settings.thinking == "adaptive":
            key: list[Any] = ["adaptive", settings.tool_choice]
        else:
            key = [settings.thinking_budget, settings.tool_choice]
        assert settings.cache_key() == canonical_json(key)
        assert settings.is_default() == (settings == ModelSettings())
    assert ModelSettings().is_default() and not ModelSettings(top_k=3).is_default()


def test_a_kept_estimate_follows_the_content_it_was_made_from() -> None:
    message = Message(role="user", content=(TextBlock(text="x" * 400),))
    fresh = Message.model_validate(message.model_dump())
    assert message_tokens(message) == message_tokens(message) == estimate_messages([fresh])
    longer = message.model_copy(update={"content": (TextBlock(text="x" * 4000),)})
    assert message_tokens(longer) > message_tokens(message)  # estimated anew, not carried
    assert message_tokens(longer) == estimate_messages(
        [Message.model_validate(longer.model_dump())]
    )
    pictured = longer.model_copy(
        update={"content": (*longer.content, Image(data=_PNG, media_type="image/png"))}
    )
    assert message_tokens(pictured) > message_tokens(longer)


_TEXTS = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ['"quoted" \\ back', "tab\t nl\n nul\x00 bell\x07", "é ✓ 😀 \u2028 \ufeff", ""]
)


@st.composite
def _blocks(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["text", "result", "use", "image"]))
    if kind == "text":
        return TextBlock(text=draw(_TEXTS))
    if kind == "result":
        return ToolResultBlock(
            tool_use_id=draw(_TEXTS), content=draw(_TEXTS), is_error=draw(st.booleans())
        )
    if kind == "use":
        return ToolUseBlock(id="t", name="n", input={"q": draw(_TEXTS)})
    return Image(data=_PNG, media_type="image/png")


@hypothesis_settings(max_examples=300, deadline=None)
@given(st.lists(_blocks(), max_size=4), st.sampled_from(["user", "assistant"]))
def test_a_messages_json_is_the_canonical_json_of_its_dump(blocks: list[Any], role: str) -> None:
    message = Message.model_validate({"role": role, "content": blocks})
    dumped = message.model_dump(mode="json")
    assert message_content_json(message) == canonical_json(dumped["content"])
    assert message_digest(message) == hashlib.sha256(canonical_json(dumped).encode()).digest()


def test_a_kept_prompt_size_follows_the_blocks_it_was_made_from() -> None:
    tool = ToolDefinition(name="t", description="d", input_schema={"type": "object"})
    request = ModelRequest(
        model="m", system=(SystemBlock(text="s" * 400),), tools=(tool,), messages=()
    )
    first = estimate_request(request)
    assert estimate_request(ModelRequest.model_validate(request.model_dump())) == first
    longer = tool.model_copy(update={"description": "d" * 4000})
    assert estimate_request(request.model_copy(update={"tools": (longer,)})) > first + 900
    assert estimate_request(request) == first
