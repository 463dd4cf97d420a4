"""The normalized message model every layer speaks.

Close to the Messages API wire shape (text, tool_use, tool_result blocks) so nothing is lost
in translation, but our own types: provider types stay inside the model clients.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from anabranch._media import IMAGE_MEDIA_TYPES, Document, Image, sniff_image_type
from anabranch._memo import IdentityMemo
from anabranch._model_settings import ModelSettings, ToolChoice
from anabranch._text import ValidJSONObject as _ValidJSONObject
from anabranch._text import ValidText, canonical_json, valid_json, valid_text
from anabranch._text import json_string as _json_string

__all__ = [
    "Attachment",
    "Block",
    "CacheTTL",
    "Document",
    "IMAGE_MEDIA_TYPES",
    "Image",
    "Message",
    "MessageList",
    "ModelRequest",
    "ModelResponse",
    "ModelSettings",
    "RawBlock",
    "RedactedThinkingBlock",
    "StopReason",
    "SystemBlock",
    "TextBlock",
    "ThinkingBlock",
    "ToolChoice",
    "ToolDefinition",
    "ToolResultBlock",
    "ToolUseBlock",
    "Usage",
    "ValidText",
    "canonical_json",
    "message_content_json",
    "message_digest",
    "messages_from_json",
    "messages_to_json",
    "sniff_image_type",
    "valid_json",
    "valid_text",
]

CacheTTL = Literal["5m", "1h"]
_TTLS = ("5m", "1h")
StopReason = Literal[
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
    "compaction",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TextBlock(_Frozen):
    type: Literal["text"] = "text"
    text: ValidText


class ThinkingBlock(_Frozen):
    """The model's visible reasoning. Sent back exactly as received (the API checks
    ``signature``); never edited, only dropped with a summarized range."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str


class RedactedThinkingBlock(_Frozen):
    """Reasoning the API encrypted: only the opaque ``data`` travels, unchanged."""

    type: Literal["redacted_thinking"] = "redacted_thinking"
    data: str


class RawBlock(_Frozen):
    """A response block of a kind this model does not name (e.g. a server tool's), kept
    exactly as the API sent it and sent back the same way: nothing is dropped."""

    type: Literal["raw"] = "raw"
    block: dict[str, Any]


Attachment = Annotated[Image | Document, Field(discriminator="type")]
"""An image or document inside a tool result."""


class ToolUseBlock(_Frozen):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: _ValidJSONObject


class ToolResultBlock(_Frozen):
    """A tool's answer: its text, then any images or documents it returned (in order)."""

    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: ValidText
    is_error: bool = False
    attachments: tuple[Attachment, ...] = Field((), exclude_if=lambda value: not value)


Block = Annotated[
    TextBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ToolUseBlock
    | ToolResultBlock
    | Image
    | Document
    | RawBlock,
    Field(discriminator="type"),
]


class Message(_Frozen):
    """One turn of a conversation."""

    role: Literal["user", "assistant"]
    content: tuple[Block, ...]

    @classmethod
    def user(cls, text: str) -> Message:
        if cls is Message and type(text) is str:
            return _user_text(text)
        return cls(role="user", content=(TextBlock(text=text),))

    @property
    def text(self) -> str:
        """All text blocks joined (tool payloads excluded)."""
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    @property
    def tool_uses(self) -> list[ToolUseBlock]:
        return [b for b in self.content if isinstance(b, ToolUseBlock)]

    @property
    def tool_results(self) -> list[ToolResultBlock]:
        return [b for b in self.content if isinstance(b, ToolResultBlock)]

    @property
    def thinking_blocks(self) -> list[ThinkingBlock | RedactedThinkingBlock]:
        return [b for b in self.content if isinstance(b, ThinkingBlock | RedactedThinkingBlock)]

    @property
    def attachments(self) -> list[Image | Document]:
        """Images and documents, also those inside tool results, in order."""
        found: list[Image | Document] = []
        for block in self.content:
            if isinstance(block, Image | Document):
                found.append(block)
            elif isinstance(block, ToolResultBlock):
                found.extend(block.attachments)
        return found

    def char_count(self) -> int:
        """Characters of the text parts (images and documents are counted apart)."""
        total = 0
        for block in self.content:
            if type(block) is ToolResultBlock:  # the usual block told apart with no call
                total += len(block.content)
            elif isinstance(block, TextBlock):  # (an exact match needs no call either)
                total += len(block.text)
            elif isinstance(block, ToolUseBlock):
                total += len(block.name) + len(canonical_json(block.input))
            elif isinstance(block, ToolResultBlock):
                total += len(block.content)
            elif isinstance(block, ThinkingBlock):
                total += len(block.thinking) + len(block.signature)
            elif isinstance(block, RedactedThinkingBlock):
                total += len(block.data)
            elif isinstance(block, Document) and block.text is not None:
                total += len(block.text)
        return total


MessageList = TypeAdapter(list[Message])

_TEXT_FIELDS = {"text"}
_USER_FIELDS = {"role", "content"}
"""The fields set of ``Message.user``'s two models (shared: pydantic copies it for a
``model_copy``, and a frozen model never updates its own)."""


def _user_text(text: str) -> Message:
    """``Message(role="user", content=(TextBlock(text=text),))`` as validation builds it
    (the text through ``valid_text``, as ``ValidText`` does; the same fields set), equal
    in every way (``==``, JSON, ``repr``, hash). A run's task lives as long as the run:
    validation would give each of its two models a fields set of its own."""
    block = TextBlock.__new__(TextBlock)
    setattr_ = object.__setattr__
    setattr_(block, "__dict__", {"type": "text", "text": valid_text(text)})
    setattr_(block, "__pydantic_fields_set__", _TEXT_FIELDS)
    setattr_(block, "__pydantic_extra__", None)
    setattr_(block, "__pydantic_private__", None)
    message = Message.__new__(Message)
    setattr_(message, "__dict__", {"role": "user", "content": (block,)})
    setattr_(message, "__pydantic_fields_set__", _USER_FIELDS)
    setattr_(message, "__pydantic_extra__", None)
    setattr_(message, "__pydantic_private__", None)
    return message


# What is derived from a message (its canonical JSON, its digest) is kept in the message's
# own ``__dict__``, next to the very ``content`` (and ``role``) it was computed from: no
# side table, no weak reference and callback per message (a run's messages live as long as
# the run, so those were long-lived objects for the cyclic GC to walk), and a
# ``model_copy`` with other content carries the old value along only to find it stale.
# The keys start with ``_``: pydantic's serialization, equality, ``repr`` and iteration
# see model fields only.
_JSON = "_anabranch_content_json"
_JSON_OF = "_anabranch_content_json_of"
_DIGEST = "_anabranch_digest"
_DIGEST_OF = "_anabranch_digest_of"
_DIGEST_ROLE = "_anabranch_digest_role"


def message_content_json(message: Message) -> str:
    """Canonical JSON of the message's content blocks (what the store keeps), computed
    once per message object: its digest and its stored record share the one encoding."""
    cached = message.__dict__
    if _JSON_OF in cached and cached[_JSON_OF] is message.content:
        text: str = cached[_JSON]
        return text
    text = _plain_content_json(message.content) or canonical_json(
        message.model_dump(mode="json")["content"]
    )
    cached[_JSON] = text
    cached[_JSON_OF] = message.content
    return text


def _plain_content_json(content: tuple[Block, ...]) -> str | None:
    """The canonical JSON of content made of text blocks and tool results without
    attachments (a task, a turn's tool results), written out directly: the bytes
    ``canonical_json`` gives for its dump. ``None`` for any other content."""
    parts = []
    for block in content:
        if type(block) is TextBlock and type(block.text) is str:
            parts.append(f'{{"text":{_json_string(block.text)},"type":"text"}}')
        elif (
            type(block) is ToolResultBlock
            and not block.attachments
            and type(block.content) is str
            and type(block.tool_use_id) is str
            and type(block.is_error) is bool
        ):
            parts.append(
                f'{{"content":{_json_string(block.content)},'
                f'"is_error":{"true" if block.is_error else "false"},'
                f'"tool_use_id":{_json_string(block.tool_use_id)},"type":"tool_result"}}'
            )
        else:
            return None  # the general way (and any value that bypassed validation)
    return "[" + ",".join(parts) + "]" if parts else None


_ROLES = ("user", "assistant")
_ROLE_JSON = {"user": '"user"', "assistant": '"assistant"'}
"""``canonical_json`` of each role."""


def message_digest(message: Message) -> bytes:
    """SHA-256 of the message's canonical JSON, computed once per message object."""
    cached = message.__dict__  # (the three entries are set together)
    if (
        _DIGEST_OF in cached
        and cached[_DIGEST_OF] is message.content
        and cached[_DIGEST_ROLE] == message.role
    ):
        digest: bytes = cached[_DIGEST]
        return digest
    # the canonical JSON of the whole message (keys sorted), around its content's
    content = message_content_json(message)
    role = message.role
    # (the roles validation allows, written out; any other value the general way)
    role_json = _ROLE_JSON[role] if role in _ROLES else canonical_json(role)
    encoded = f'{{"content":{content},"role":{role_json}}}'
    digest = hashlib.sha256(encoded.encode()).digest()
    cached[_DIGEST] = digest
    cached[_DIGEST_OF] = message.content
    cached[_DIGEST_ROLE] = message.role
    return digest


_PROMPTS: IdentityMemo[hashlib._Hash] = IdentityMemo()


def _prompt_hash(
    system: tuple[SystemBlock, ...], tools: tuple[ToolDefinition, ...]
) -> hashlib._Hash:
    """SHA-256 state after the canonical JSON of a request's system blocks and tools,
    reused while they are the same objects (a run sends its snapshot's with every call).
    Copy it before updating.

    The state is kept with the first system block too (``_PROMPT_KEPT``), with the blocks
    after it and the tools it was computed with: a run's next call finds it there with
    no lookup (the identity memo costs a few calls per model call). It is used only while
    the tools are the very same tuple (equal tools may encode differently: ``1 == 1.0`` in
    a schema) and the blocks after the first the same or equal ones (a text and a mark);
    anything else asks the memo."""
    if not system:
        return _PROMPTS.get((system, tools), _prompt_state)
    kept = system[0].__dict__
    if _PROMPT_KEPT in kept:
        rest, kept_tools, state = kept[_PROMPT_KEPT]
        if kept_tools is tools and rest == system[1:]:
            found: hashlib._Hash = state
            return found
    state = _PROMPTS.get((system, tools), _prompt_state)
    kept[_PROMPT_KEPT] = (system[1:], tools, state)  # (not the tuple holding the block)
    return state


_PROMPT_KEPT = "_anabranch_prompt_state"
"""Kept in a request's first system block's ``__dict__``: the blocks after it, the tools
and the prompt's hash state (no reference back to the block: no cycle)."""


def _prompt_state(
    system: tuple[SystemBlock, ...], tools: tuple[ToolDefinition, ...]
) -> hashlib._Hash:
    return hashlib.sha256(
        canonical_json(
            {
                "system": [b.model_dump(mode="json") for b in system],
                "tools": [t.model_dump(mode="json") for t in tools],
            }
        ).encode()
    )


_PREFIX_HEAD = "_anabranch_prefix_head"
_PREFIX = "_anabranch_prefix"
_PREFIX_STATE = "_anabranch_prefix_state"
"""Kept in the first message's ``__dict__`` (three entries, not a record per call): its
digest, the messages that followed it in the latest request that began with it, the hash
state after all of them."""
_EMPTY_HASH = hashlib.sha256().digest()


def _messages_hash(messages: tuple[Message, ...]) -> bytes:
    """SHA-256 of the message digests in order, extending the latest request's if it can.

    A run's next request repeats the previous one's messages and adds a couple: the hash
    state after them is kept with the first message (what every request of the run's
    context begins with), so only the new messages are hashed, whatever other runs did
    in between. Nothing is trusted that was not checked: the kept state is used only
    while the first message still has the digest it was computed from (a ``model_copy``
    carries the entry along) and the messages after it are the very same (or equal)
    ones; anything else (a compaction, a rewind, a cleared result in the middle) hashes
    from the start. The value is the same either way: the hash of the concatenated
    digests, so stored fingerprints compare across versions. The entry holds only the
    messages after the first (no reference cycle); it lives as long as the first message.
    """
    if not messages:
        return _EMPTY_HASH
    first = messages[0]
    head = message_digest(first)
    kept = first.__dict__  # (the three entries are set together)
    if _PREFIX in kept and kept[_PREFIX_HEAD] == head:
        rest: tuple[Message, ...] = kept[_PREFIX]
        size = len(rest) + 1
        count = len(messages)
        if size <= count and messages[1:size] == rest:
            if size == count:
                done: bytes = kept[_PREFIX_STATE].digest()
                return done
            state: hashlib._Hash = kept[_PREFIX_STATE].copy()  # never updated in place
            state.update(b"".join(map(message_digest, messages[size:])))
            kept[_PREFIX_HEAD], kept[_PREFIX], kept[_PREFIX_STATE] = head, messages[1:], state
            return state.digest()
    state = hashlib.sha256(head)  # the digests' hash: sha256(head + digests of the rest)
    state.update(b"".join(map(message_digest, messages[1:])))
    kept[_PREFIX_HEAD], kept[_PREFIX], kept[_PREFIX_STATE] = head, messages[1:], state
    return state.digest()


def messages_to_json(messages: list[Message]) -> str:
    return MessageList.dump_json(messages).decode()


def messages_from_json(data: str | bytes) -> list[Message]:
    return MessageList.validate_json(data)


class Usage(_Frozen):
    """Token usage of one model call, in the API's own terms."""

    input_tokens: int = 0
    """Uncached input tokens only."""
    output_tokens: int = 0
    """All output tokens, thinking included (billed as output)."""
    thinking_tokens: int = Field(0, exclude_if=lambda value: value == 0)
    """The part of ``output_tokens`` spent thinking (when the API reports it)."""
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_creation_5m_input_tokens: int = 0
    cache_creation_1h_input_tokens: int = 0

    @property
    def total_input_tokens(self) -> int:
        """Whole prompt: uncached + cache read + cache write."""
        return self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            thinking_tokens=self.thinking_tokens + other.thinking_tokens,
            cache_read_input_tokens=self.cache_read_input_tokens + other.cache_read_input_tokens,
            cache_creation_input_tokens=self.cache_creation_input_tokens
            + other.cache_creation_input_tokens,
            cache_creation_5m_input_tokens=self.cache_creation_5m_input_tokens
            + other.cache_creation_5m_input_tokens,
            cache_creation_1h_input_tokens=self.cache_creation_1h_input_tokens
            + other.cache_creation_1h_input_tokens,
        )


class SystemBlock(_Frozen):
    """One block of the system prompt; ``cache`` puts a cache breakpoint at its end."""

    text: ValidText
    cache: CacheTTL | None = None


class ToolDefinition(_Frozen):
    """What the model is told about a tool."""

    name: str
    description: ValidText
    input_schema: dict[str, Any]
    cache: CacheTTL | None = None


class ModelRequest(_Frozen):
    """Everything one model call sends. Serializes deterministically (see ``fingerprint``)."""

    model: str
    system: tuple[SystemBlock, ...] = ()
    tools: tuple[ToolDefinition, ...] = ()
    messages: tuple[Message, ...]
    max_tokens: int = 4096
    message_breakpoints: tuple[tuple[int, CacheTTL], ...] = ()
    """Cache breakpoints on the last block of ``messages[i]``, as (i, ttl)."""
    settings: ModelSettings = Field(
        default_factory=ModelSettings, exclude_if=lambda value: value.is_default()
    )
    previous_response_id: str | None = Field(None, exclude_if=lambda value: value is None)
    """The run's previous response, for cache diagnostics (not part of the fingerprint)."""

    def fingerprint(self) -> str:
        """SHA-256 over the canonical JSON of everything but the messages, then a hash of
        each message's own digest in order. Messages are frozen, so each is serialized once
        and a growing conversation hashes only what is new: the cost stays flat in its
        length instead of re-serializing the whole history on every call."""
        digest = _prompt_hash(self.system, self.tools).copy()
        digest.update(self._head_json().encode() + _messages_hash(self.messages))
        return digest.hexdigest()

    def _head_json(self) -> str:
        """The canonical JSON of what the fingerprint covers besides the prompt and the
        messages: written out directly (keys in sorted order) for the shape validation
        gives, else through ``canonical_json``; the same text either way."""
        settings = None if self.settings.is_default() else self.settings
        marks: list[str] = []
        for index, ttl in self.message_breakpoints:
            if type(index) is not int or ttl not in _TTLS:
                marks.clear()  # a value that bypassed validation (``model_copy(update=)``)
                break
            marks.append(f'[{index},"{ttl}"]')
        if (
            len(marks) != len(self.message_breakpoints)
            or type(self.max_tokens) is not int
            or type(self.model) is not str
        ):
            head: dict[str, Any] = {
                "model": self.model,
                "max_tokens": self.max_tokens,
                "message_breakpoints": [list(b) for b in self.message_breakpoints],
            }
            if settings is not None:
                head["settings"] = settings.model_dump(mode="json", exclude={"extra_headers"})
            return canonical_json(head)
        text = (
            f'{{"max_tokens":{self.max_tokens},"message_breakpoints":[{",".join(marks)}],'
            f'"model":{_json_string(self.model)}'
        )
        if settings is not None:
            dumped = settings.model_dump(mode="json", exclude={"extra_headers"})
            text += f',"settings":{canonical_json(dumped)}'
        return text + "}"

    @classmethod
    def _of_valid_parts(
        cls,
        *,
        model: str,
        system: tuple[SystemBlock, ...],
        tools: tuple[ToolDefinition, ...],
        messages: tuple[Message, ...],
        max_tokens: int,
        message_breakpoints: tuple[tuple[int, CacheTTL], ...],
        settings: ModelSettings,
        previous_response_id: str | None,
    ) -> ModelRequest:
        """A request from parts that already are what validation makes of them (frozen
        blocks, messages and settings in tuples, an ``int`` budget, ``(int, ttl)`` marks),
        holding those very tuples: validation would copy each tuple, and a run's request
        lives as long as its model takes to answer. Equal to the validated request."""
        request = cls.__new__(cls)
        setattr_ = object.__setattr__
        setattr_(
            request,
            "__dict__",
            {
                "model": model,
                "system": system,
                "tools": tools,
                "messages": messages,
                "max_tokens": max_tokens,
                "message_breakpoints": message_breakpoints,
                "settings": settings,
                "previous_response_id": previous_response_id,
            },
        )
        # every field is set; one set shared by these requests (pydantic copies it for a
        # ``model_copy``, a frozen model never updates its own)
        setattr_(request, "__pydantic_fields_set__", _REQUEST_FIELDS)
        setattr_(request, "__pydantic_extra__", None)
        setattr_(request, "__pydantic_private__", None)
        return request

    def breakpoint_count(self) -> int:
        return (
            sum(1 for b in self.system if b.cache)
            + sum(1 for t in self.tools if t.cache)
            + len(self.message_breakpoints)
        )


_REQUEST_FIELDS = set(ModelRequest.model_fields)


class ModelResponse(_Frozen):
    """A complete model answer."""

    id: str = ""
    model: str = ""
    content: tuple[Block, ...]
    stop_reason: StopReason | None = "end_turn"
    usage: Usage = Usage()
    cache_miss: str | None = Field(None, exclude_if=lambda value: value is None)
    """The API's ``diagnostics.cache_miss_reason`` type, when cache diagnostics were asked
    for and the prompt diverged (``model_changed``, ``system_changed``, ``tools_changed``,
    ``messages_changed``, ...)."""

    def to_message(self) -> Message:
        """The assistant message of this response: the same object on every call, so what
        is derived from it (its stored JSON, its digest) is computed once."""
        cached = self.__dict__  # kept with the content it was made from (see ``_JSON``)
        if _MESSAGE_OF in cached and cached[_MESSAGE_OF] is self.content:
            kept: Message = cached[_MESSAGE]  # (both entries are set together)
            return kept
        message = Message(role="assistant", content=self.content)
        cached[_MESSAGE] = message
        cached[_MESSAGE_OF] = self.content
        return message


_MESSAGE = "_anabranch_message"
_MESSAGE_OF = "_anabranch_message_of"
