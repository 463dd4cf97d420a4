"""Canonical JSON and SHA-256 digests of messages and prompts, each computed once per
object and kept with it (``ModelRequest.fingerprint`` is built from them), and a message
list's JSON (re-exported by ``messages``)."""

from __future__ import annotations

import hashlib

from anabranch._memo import IdentityMemo
from anabranch._message_model import (
    Block,
    Message,
    MessageList,
    SystemBlock,
    TextBlock,
    ToolDefinition,
    ToolResultBlock,
)
from anabranch._text import canonical_json
from anabranch._text import json_string as _json_string

__all__ = [
    "message_content_json",
    "message_digest",
    "messages_from_json",
    "messages_hash",
    "messages_to_json",
    "prompt_hash",
]


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


def prompt_hash(
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


def messages_hash(messages: tuple[Message, ...]) -> bytes:
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
