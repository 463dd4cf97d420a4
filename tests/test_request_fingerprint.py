"""The request fingerprint is a pure function of the request, however it is computed."""

from __future__ import annotations

import hashlib

import pytest

from anabranch import _message_json as message_json
from anabranch import messages as messages_module
from anabranch.messages import (
    Message,
    ModelRequest,
    ModelSettings,
    SystemBlock,
    TextBlock,
    ThinkingBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
    canonical_json,
    message_content_json,
)


def _conversation(turns: int) -> list[Message]:
    out: list[Message] = []
    for i in range(turns):
        out += [
            Message.user(f"question {i}"),
            Message(
                role="assistant",
                content=(ToolUseBlock(id=f"t{i}", name="lookup", input={"q": i}),),
            ),
            Message(role="user", content=(ToolResultBlock(tool_use_id=f"t{i}", content="r" * i),)),
            Message(role="assistant", content=(TextBlock(text=f"answer {i}"),)),
        ]
    return out


def _forget_encodings(message: Message) -> None:
    for key in [k for k in message.__dict__ if k.startswith("_anabranch_")]:
        del message.__dict__[key]


def _uncached(request: ModelRequest) -> str:
    for message in request.messages:
        _forget_encodings(message)
    for block in request.system:  # the prompt's state kept with its first block
        for key in [k for k in block.__dict__ if k.startswith("_anabranch_")]:
            del block.__dict__[key]
    message_json._PROMPTS.clear()
    return request.fingerprint()


def test_a_copy_with_other_content_or_role_is_encoded_anew() -> None:
    question = Message.user("question")
    digest, encoded = messages_module.message_digest(question), message_content_json(question)
    edited = question.model_copy(update={"content": (TextBlock(text="another"),)})
    assert message_content_json(edited) == canonical_json([{"type": "text", "text": "another"}])
    assert messages_module.message_digest(edited) != digest
    answer = question.model_copy(update={"role": "assistant"})  # same content object
    assert message_content_json(answer) == encoded
    assert messages_module.message_digest(answer) != digest
    assert messages_module.message_digest(question) == digest  # the original is unchanged
    assert question == Message.user("question")  # what is kept is no part of equality
    assert question.model_dump() == Message.user("question").model_dump()


def test_incremental_fingerprint_equals_a_fresh_computation() -> None:
    history = _conversation(30)
    seen = []
    for end in range(1, len(history) + 1):
        seen.append(ModelRequest(model="m", messages=tuple(history[:end])).fingerprint())
    for end in (1, 7, len(history)):
        request = ModelRequest(model="m", messages=tuple(history[:end]))
        assert _uncached(request) == seen[end - 1]
    assert len(set(seen)) == len(seen)


def test_equal_content_in_new_objects_gives_the_same_fingerprint() -> None:
    history = _conversation(5)
    copies = [Message.model_validate(m.model_dump()) for m in history]
    a = ModelRequest(model="m", messages=tuple(history)).fingerprint()
    b = ModelRequest(model="m", messages=tuple(copies)).fingerprint()
    assert a == b


def test_any_change_changes_the_fingerprint() -> None:
    history = _conversation(5)
    base = ModelRequest(model="m", messages=tuple(history))
    fingerprint = base.fingerprint()
    edited = [*history[:3], Message.user("something else"), *history[4:]]  # a middle message
    assert ModelRequest(model="m", messages=tuple(edited)).fingerprint() != fingerprint
    assert base.model_copy(update={"model": "n"}).fingerprint() != fingerprint
    assert base.model_copy(update={"max_tokens": 5}).fingerprint() != fingerprint
    with_system = base.model_copy(update={"system": (SystemBlock(text="be brief"),)})
    assert with_system.fingerprint() != fingerprint
    tool = ToolDefinition(name="t", description="d", input_schema={"type": "object"})
    with_tool = with_system.model_copy(update={"tools": (tool,)})
    assert with_tool.fingerprint() not in (fingerprint, with_system.fingerprint())
    assert ModelRequest(model="m", messages=tuple(history[1:])).fingerprint() != fingerprint
    assert base.fingerprint() == fingerprint  # and the original is unchanged after all that


def test_message_digest_is_the_canonical_json_hash() -> None:
    for message in [
        Message.user("hello"),
        Message.user('é ✓ "quoted" \\ \n tab\t'),
        *_conversation(3),
        Message(
            role="assistant",
            content=(
                TextBlock(text="calling"),
                ToolUseBlock(id="t", name="n", input={"z": [1, {"b": None, "a": "ü"}], "a": 2.5}),
            ),
        ),
    ]:
        dumped = message.model_dump(mode="json")
        expected = hashlib.sha256(canonical_json(dumped).encode()).digest()
        assert messages_module.message_digest(message) == expected
        assert messages_module.message_content_json(message) == canonical_json(dumped["content"])


def test_a_request_with_a_prompt_is_fingerprinted_the_same_cached_or_not() -> None:
    tool = ToolDefinition(name="t", description="d", input_schema={"type": "object"}, cache="5m")
    request = ModelRequest(
        model="m",
        system=(SystemBlock(text="be brief", cache="5m"), SystemBlock(text="today")),
        tools=(tool,),
        messages=tuple(_conversation(2)),
    )
    cached = [request.fingerprint() for _ in range(3)]
    assert cached == [_uncached(request)] * 3
    # the same content in new objects: the same fingerprint
    again = ModelRequest.model_validate(request.model_dump())
    assert again.fingerprint() == cached[0]


def test_a_cached_prompt_dies_with_its_blocks() -> None:
    import gc

    _uncached(ModelRequest(model="m", messages=()))
    before = len(message_json._PROMPTS)
    system = (SystemBlock(text="short-lived"),)
    ModelRequest(model="m", system=system, messages=()).fingerprint()
    assert len(message_json._PROMPTS) == before + 1
    del system
    gc.collect()
    assert len(message_json._PROMPTS) == before


def test_a_prompt_kept_with_its_first_block_serves_only_the_same_blocks_and_tools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second = SystemBlock(text="be brief", cache="5m"), SystemBlock(text="today")
    tools = (ToolDefinition(name="t", description="d", input_schema={"type": "object"}),)
    history = tuple(_conversation(1))
    request = ModelRequest(model="m", system=(first, second), tools=tools, messages=history)
    assert request.fingerprint() == _by_definition(request)

    def no_memo(*_args: object) -> object:
        raise AssertionError("the prompt's state was looked up again")

    # the next call of the run (a new request, the very same blocks and tools): no lookup
    monkeypatch.setattr(message_json._PROMPTS, "get", no_memo)
    again = request.model_copy(update={"messages": history[:2]})
    assert again.fingerprint() == _by_definition(again)
    monkeypatch.undo()
    # the same first block with other blocks after it, or other tools: not the kept state
    other_tools = (ToolDefinition(name="u", description="d", input_schema={"type": "object"}),)
    for system, with_tools in [
        ((first, SystemBlock(text="tomorrow")), tools),
        ((first,), tools),
        ((first, second), other_tools),
        ((first, second), ()),
        ((first, second), tools),
    ]:
        changed = ModelRequest(model="m", system=system, tools=with_tools, messages=history)
        assert changed.fingerprint() == _by_definition(changed)


# ---------------------------------------------------------------- the definition, pinned
def _by_definition(request: ModelRequest) -> str:
    """The fingerprint as defined (what stored call rows hold), computed from scratch."""
    prompt = canonical_json(
        {
            "system": [b.model_dump(mode="json") for b in request.system],
            "tools": [t.model_dump(mode="json") for t in request.tools],
        }
    )
    head: dict[str, object] = {
        "model": request.model,
        "max_tokens": request.max_tokens,
        "message_breakpoints": [list(b) for b in request.message_breakpoints],
    }
    if request.settings != ModelSettings():
        head["settings"] = request.settings.model_dump(mode="json", exclude={"extra_headers"})
    digests = b"".join(
        hashlib.sha256(canonical_json(m.model_dump(mode="json")).encode()).digest()
        for m in request.messages
    )
    whole = prompt.encode() + canonical_json(head).encode() + hashlib.sha256(digests).digest()
    return hashlib.sha256(whole).hexdigest()


def _golden() -> tuple[ModelRequest, ModelRequest]:
    tool = ToolDefinition(
        name="lookup",
        description="Looks things up.",
        input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
        cache="1h",
    )
    history = [
        Message.user('Wie spät ist es? ✓ "quoted"'),
        Message(
            role="assistant",
            content=(
                TextBlock(text="checking"),
                ToolUseBlock(id="t1", name="lookup", input={"q": "zeit", "n": [1, 2.5, None]}),
            ),
        ),
        Message(role="user", content=(ToolResultBlock(tool_use_id="t1", content="12:00"),)),
        Message(
            role="assistant",
            content=(
                ThinkingBlock(thinking="hm", signature="sig"),
                TextBlock(text="Es ist zwölf."),
            ),
        ),
    ]
    plain = ModelRequest(
        model="claude-ü",
        system=(SystemBlock(text="be brief", cache="1h"), SystemBlock(text="today")),
        tools=(tool,),
        messages=tuple(history),
        max_tokens=1000,
        message_breakpoints=((0, "1h"), (3, "5m")),
    )
    settings = ModelSettings(thinking_budget=2048, tool_choice="auto", extra_headers={"x": "y"})
    return plain, plain.model_copy(update={"settings": settings})


def test_stored_fingerprints_keep_their_values() -> None:
    # computed by the code of round 4 (main 020bf63): call rows stored then must compare
    plain, tuned = _golden()
    assert plain.fingerprint() == "a0d035276164aff79e3affb6cb381457167c7d74b691938b47f29fadf120a6b0"
    assert tuned.fingerprint() == "804679592441c965cf284666510e67ca0d36dbc78498747f7c94634e864d6bde"
    empty = ModelRequest(model="m", messages=())
    assert empty.fingerprint() == "5da11acca0498f887238144a65b247b46e3777ca35145c2aeb9d498d8e415c07"
    for request in (plain, tuned, empty):
        assert request.fingerprint() == _by_definition(request)


def test_a_head_that_bypassed_validation_is_encoded_as_canonical_json() -> None:
    plain, _ = _golden()
    for update in ({"max_tokens": True}, {"message_breakpoints": ((False, "5m"),)}):
        odd = plain.model_copy(update=update)
        assert odd.fingerprint() == _by_definition(odd) != plain.fingerprint()


def test_interleaved_runs_extend_their_own_prefix_and_match_the_definition() -> None:
    runs = [_conversation(6) for _ in range(3)]
    for end in range(1, len(runs[0]) + 1):
        for history in runs:  # one call of each run in turn, as concurrent runs make them
            request = ModelRequest(model="m", messages=tuple(history[:end]))
            assert request.fingerprint() == _by_definition(request)
    first = runs[0][0]
    kept = first.__dict__[message_json._PREFIX]
    assert kept == tuple(runs[0][1:])  # run 0's prefix extended call by call


def test_a_changed_context_is_hashed_from_the_start() -> None:
    history = _conversation(6)
    full = ModelRequest(model="m", messages=tuple(history))
    assert full.fingerprint() == _by_definition(full)
    # a clear: a message in the middle replaced, the first one kept
    stub = Message(role="user", content=(ToolResultBlock(tool_use_id="t1", content="[cleared]"),))
    cleared = [*history[:6], stub, *history[7:]]
    # a compaction: a new opening, then the kept tail (the very same objects)
    compacted = [Message.user("summary of the earlier turns"), *history[-6:]]
    # a rewind: the context before a compaction, shorter than what was hashed last
    rewound = history[:9]
    # equal messages in new objects, and an edited copy of the first one
    copies = [Message.model_validate(m.model_dump()) for m in history]
    edited = [history[0].model_copy(update={"content": (TextBlock(text="other"),)}), *history[1:]]
    for context in (cleared, compacted, rewound, history, copies, edited, history[:1], history):
        request = ModelRequest(model="m", messages=tuple(context))
        assert request.fingerprint() == _by_definition(request)
    assert ModelRequest(model="m", messages=tuple(edited)).fingerprint() != full.fingerprint()
