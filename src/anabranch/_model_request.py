"""What one model call sends and gets back: ``ModelRequest`` (with its fingerprint),
``ModelResponse`` and ``Usage`` (re-exported by ``messages``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from anabranch._message_json import messages_hash, prompt_hash
from anabranch._message_model import (
    CACHE_TTLS,
    Block,
    CacheTTL,
    Frozen,
    Message,
    SystemBlock,
    ToolDefinition,
)
from anabranch._model_settings import ModelSettings
from anabranch._text import canonical_json
from anabranch._text import json_string as _json_string

__all__ = ["ModelRequest", "ModelResponse", "StopReason", "Usage"]

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


class Usage(Frozen):
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


class ModelRequest(Frozen):
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
        digest = prompt_hash(self.system, self.tools).copy()
        digest.update(self._head_json().encode() + messages_hash(self.messages))
        return digest.hexdigest()

    def _head_json(self) -> str:
        """The canonical JSON of what the fingerprint covers besides the prompt and the
        messages: written out directly (keys in sorted order) for the shape validation
        gives, else through ``canonical_json``; the same text either way."""
        settings = None if self.settings.is_default() else self.settings
        marks: list[str] = []
        for index, ttl in self.message_breakpoints:
            if type(index) is not int or ttl not in CACHE_TTLS:
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


class ModelResponse(Frozen):
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
        cached = self.__dict__  # kept with the content it was made from (see ``_message_json``)
        if _MESSAGE_OF in cached and cached[_MESSAGE_OF] is self.content:
            kept: Message = cached[_MESSAGE]  # (both entries are set together)
            return kept
        message = Message(role="assistant", content=self.content)
        cached[_MESSAGE] = message
        cached[_MESSAGE_OF] = self.content
        return message


_MESSAGE = "_anabranch_message"
_MESSAGE_OF = "_anabranch_message_of"
