"""A tool turn's blocks built without validation are the very models validation builds.

``runtime._built_blocks`` skips pydantic for parts of exactly the types it keeps as they are;
anything else goes through pydantic. Either way the result must equal the validated model
in every way a user can see: ``==``, hash, ``repr``, JSON, fields set, the text cleaned of
lone surrogates, the blocks kept as the same objects.
"""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from anabranch._media import Image
from anabranch.messages import (
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    message_content_json,
    message_digest,
)
from anabranch.runtime._built_blocks import result_block, user_message

PNG = (
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00"
    b"\x1f\x15\xc4\x89\x00\x00\x00\rIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N\x00"
    b"\x00\x00\x00IEND\xaeB`\x82"
)


class _Text(str):
    pass


def _same(built: pydantic.BaseModel, validated: pydantic.BaseModel) -> None:
    assert type(built) is type(validated)
    assert built == validated
    try:
        expected = hash(validated)
    except TypeError:  # a tool_use block's input is a dict
        with pytest.raises(TypeError):
            hash(built)
    else:
        assert hash(built) == expected
    assert repr(built) == repr(validated)
    assert built.model_dump_json() == validated.model_dump_json()
    assert built.model_fields_set == validated.model_fields_set
    assert list(built.__dict__) == list(validated.__dict__)
    assert built.__pydantic_extra__ == validated.__pydantic_extra__
    assert built.__pydantic_private__ == validated.__pydantic_private__


RESULTS: list[tuple[Any, Any, Any, Any]] = [
    ("toolu_1", "plain ascii", False, ()),
    ("toolu_2", "café ✓ 日本", True, ()),
    ("toolu_3", "lone \udc80 surrogate", False, ()),
    ("toolu_4", "", False, ()),
    ("toolu_5", _Text("a str subclass"), False, ()),
    ("toolu_6", "with an image", False, (Image(data=PNG, media_type="image/png"),)),
    ("toolu_7", "a list of attachments", False, []),
]


@pytest.mark.parametrize(("call_id", "content", "is_error", "attachments"), RESULTS)
def test_a_result_block_is_the_validated_one(
    call_id: Any, content: Any, is_error: Any, attachments: Any
) -> None:
    built = result_block(call_id, content, is_error, attachments)
    validated = ToolResultBlock(
        tool_use_id=call_id, content=content, is_error=is_error, attachments=attachments
    )
    _same(built, validated)
    assert type(built.content) is str and "\udc80" not in built.content
    assert message_content_json(Message(role="user", content=(built,))) == message_content_json(
        Message(role="user", content=(validated,))
    )


def test_bad_parts_get_pydantic_s_errors() -> None:
    with pytest.raises(pydantic.ValidationError):
        result_block("toolu_1", 42, False, ())  # type: ignore[arg-type]
    with pytest.raises(pydantic.ValidationError):
        user_message(("not a block",))  # type: ignore[arg-type]
    with pytest.raises(pydantic.ValidationError):  # a block whose tag was bypassed
        user_message((TextBlock.model_construct(type="tool_use", text="x"),))  # type: ignore[arg-type]


def test_a_user_message_is_the_validated_one_and_keeps_its_blocks() -> None:
    blocks = (
        result_block("toolu_1", "done", False, ()),
        ToolResultBlock(
            tool_use_id="toolu_2",
            content="also",
            attachments=(Image(data=PNG, media_type="image/png"),),
        ),
        TextBlock(text="[note] a limit's notice"),
    )
    built, validated = user_message(blocks), Message(role="user", content=blocks)
    _same(built, validated)
    assert all(a is b for a, b in zip(built.content, validated.content, strict=True))
    assert message_digest(built) == message_digest(validated)
    assert message_content_json(built) == message_content_json(validated)
    copied = built.model_copy(update={"content": blocks[:1]})
    assert copied.model_fields_set == {"role", "content"}
    assert built.model_fields_set == {"role", "content"}  # the shared set is not changed
    assert copied == Message(role="user", content=blocks[:1])


def test_any_block_and_other_content_are_the_validated_ones() -> None:
    use = ToolUseBlock(id="toolu_1", name="note", input={"text": "x"})
    for content in [(use,), [TextBlock(text="a list")], ()]:
        _same(user_message(content), Message(role="user", content=content))  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["plain ascii", "café ✓ 日本", "lone \udc80 surrogate", ""])
def test_a_task_message_is_the_validated_one_and_shares_its_fields_sets(text: str) -> None:
    built = Message.user(text)
    validated = Message(role="user", content=(TextBlock(text=text),))
    _same(built, validated)
    _same(built.content[0], validated.content[0])
    assert message_digest(built) == message_digest(validated)
    # a run's task lives as long as the run: no fields set of its own for either model
    other = Message.user("another task")
    assert built.model_fields_set is other.model_fields_set
    assert built.content[0].model_fields_set is other.content[0].model_fields_set
    copied = built.content[0].model_copy(update={"type": "text"})
    assert copied.model_fields_set == {"type", "text"}
    assert built.content[0].model_fields_set == {"text"}  # the shared set is not changed


def test_a_task_message_of_a_subclass_or_a_str_subclass_is_validated() -> None:
    class Turn(Message):
        pass

    assert type(Turn.user("x")) is Turn
    assert Turn.user("x").model_fields_set is not Message.user("x").model_fields_set
    validated = Message.user(_Text("a str subclass"))
    assert type(validated.text) is str  # (validation's conversion)
    assert validated.model_fields_set is not Message.user("x").model_fields_set
