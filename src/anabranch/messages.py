"""The normalized message model every layer speaks.

Close to the Messages API wire shape (text, tool_use, tool_result blocks) so nothing is lost
in translation, but our own types: provider types stay inside the model clients.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

__all__ = [
    "Block",
    "CacheTTL",
    "Message",
    "MessageList",
    "ModelRequest",
    "ModelResponse",
    "StopReason",
    "SystemBlock",
    "TextBlock",
    "ToolDefinition",
    "ToolResultBlock",
    "ToolUseBlock",
    "Usage",
    "canonical_json",
    "messages_from_json",
    "message_digest",
    "messages_to_json",
]

CacheTTL = Literal["5m", "1h"]
StopReason = Literal[
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
]


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace. Used for anything cached or hashed."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TextBlock(_Frozen):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(_Frozen):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Frozen):
    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: str
    is_error: bool = False


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class Message(_Frozen):
    """One turn of a conversation."""

    role: Literal["user", "assistant"]
    content: tuple[Block, ...]

    @classmethod
    def user(cls, text: str) -> Message:
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

    def char_count(self) -> int:
        total = 0
        for block in self.content:
            if isinstance(block, TextBlock):
                total += len(block.text)
            elif isinstance(block, ToolUseBlock):
                total += len(block.name) + len(canonical_json(block.input))
            else:
                total += len(block.content)
        return total


MessageList = TypeAdapter(list[Message])

_DIGESTS: dict[int, bytes] = {}
"""Digest of each live message, by ``id``; an entry is dropped when its message dies."""
_DIGEST_REFS: dict[int, weakref.ref[Message]] = {}


def _forget(key: int) -> None:
    _DIGESTS.pop(key, None)
    _DIGEST_REFS.pop(key, None)


def message_digest(message: Message) -> bytes:
    """SHA-256 of the message's canonical JSON, computed once per message object."""
    key = id(message)
    digest = _DIGESTS.get(key)
    if digest is None:
        digest = hashlib.sha256(canonical_json(message.model_dump(mode="json")).encode()).digest()
        _DIGESTS[key] = digest
        _DIGEST_REFS[key] = weakref.ref(message, lambda _ref: _forget(key))
    return digest


def messages_digest(messages: tuple[Message, ...] | list[Message]) -> bytes:
    """The concatenated per-message digests (a C-speed lookup per already-hashed message)."""
    found = list(map(_DIGESTS.get, map(id, messages)))
    if None not in found:
        return b"".join(found)  # type: ignore[arg-type]
    return b"".join(
        d if d is not None else message_digest(m) for d, m in zip(found, messages, strict=True)
    )


_PREFIXES: dict[int, tuple[tuple[Message, ...], Any]] = {}
"""Recent message tuples (by ``id`` of their first message) with the hash state after them."""
_PREFIX_LIMIT = 8


_PROMPTS: dict[tuple[int, int], tuple[Any, Any, str]] = {}


def _prompt_json(system: tuple[SystemBlock, ...], tools: tuple[ToolDefinition, ...]) -> str:
    """Canonical JSON of a request's system blocks and tools, reused while they are the
    same objects (a run keeps its snapshot's tuples from call to call)."""
    key = (id(system), id(tools))
    cached = _PROMPTS.get(key)
    if cached is not None and cached[0] is system and cached[1] is tools:
        return cached[2]
    text = canonical_json(
        {
            "system": [b.model_dump(mode="json") for b in system],
            "tools": [t.model_dump(mode="json") for t in tools],
        }
    )
    _PROMPTS[key] = (system, tools, text)
    while len(_PROMPTS) > _PREFIX_LIMIT:
        del _PROMPTS[next(iter(_PROMPTS))]
    return text


def _messages_hash(messages: tuple[Message, ...]) -> bytes:
    """Hash of the message digests in order, extending a recent request's prefix if it can.

    A conversation's next request usually repeats the previous one's messages and adds a
    few: those are recognised by tuple equality (identity first, so it is cheap) and only
    the new messages are hashed. Holds at most ``_PREFIX_LIMIT`` recent tuples.
    """
    if not messages:
        return hashlib.sha256().digest()
    key = id(messages[0])
    cached = _PREFIXES.pop(key, None)
    if (
        cached is not None
        and len(cached[0]) <= len(messages)
        and (messages[: len(cached[0])] == cached[0])
    ):
        state = cached[1].copy()
        state.update(messages_digest(messages[len(cached[0]) :]))
    else:
        state = hashlib.sha256(messages_digest(messages))
    _PREFIXES[key] = (messages, state.copy())
    while len(_PREFIXES) > _PREFIX_LIMIT:
        del _PREFIXES[next(iter(_PREFIXES))]
    return bytes(state.digest())


def messages_to_json(messages: list[Message]) -> str:
    return MessageList.dump_json(messages).decode()


def messages_from_json(data: str | bytes) -> list[Message]:
    return MessageList.validate_json(data)


class Usage(_Frozen):
    """Token usage of one model call, in the API's own terms."""

    input_tokens: int = 0
    """Uncached input tokens only."""
    output_tokens: int = 0
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

    text: str
    cache: CacheTTL | None = None


class ToolDefinition(_Frozen):
    """What the model is told about a tool."""

    name: str
    description: str
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

    def fingerprint(self) -> str:
        """SHA-256 over the canonical JSON of everything but the messages, then a hash of
        each message's own digest in order. Messages are frozen, so each is serialized once
        and a growing conversation hashes only what is new: the cost stays flat in its
        length instead of re-serializing the whole history on every call."""
        digest = hashlib.sha256(_prompt_json(self.system, self.tools).encode())
        head = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "message_breakpoints": [list(b) for b in self.message_breakpoints],
        }
        digest.update(canonical_json(head).encode())
        digest.update(_messages_hash(self.messages))
        return digest.hexdigest()

    def breakpoint_count(self) -> int:
        return (
            sum(1 for b in self.system if b.cache)
            + sum(1 for t in self.tools if t.cache)
            + len(self.message_breakpoints)
        )


class ModelResponse(_Frozen):
    """A complete model answer."""

    id: str = ""
    model: str = ""
    content: tuple[Block, ...]
    stop_reason: StopReason | None = "end_turn"
    usage: Usage = Usage()

    def to_message(self) -> Message:
        return Message(role="assistant", content=self.content)
