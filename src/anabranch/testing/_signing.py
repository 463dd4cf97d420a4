"""Signatures of the thinking blocks the local server and the test models emit.

The real API signs each thinking block and refuses one whose text or signature changed.
These signatures do the same job offline: a keyed digest of the thinking text (and of a
redacted block's payload), stable across processes, so a resumed session verifies.

On the models with preserved thinking the API also binds each block to its prefix (the
system prompt, the tools and everything before the block). A bound signature here carries
the prefix digest and a keyed digest over text and prefix: ``<text mac>|<prefix>|<mac>``
(a redacted block's ``data`` gets the same ``|<prefix>|<mac>`` tail).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence

from anabranch.messages import (
    Block,
    Message,
    RawBlock,
    RedactedThinkingBlock,
    SystemBlock,
    ThinkingBlock,
    ToolDefinition,
    canonical_json,
)

__all__ = [
    "bind",
    "bound_prefix",
    "chained",
    "compaction_content",
    "compaction_record",
    "compaction_signature",
    "leading_compaction",
    "request_chain",
    "prefix_digest",
    "prompt_state",
    "sealed",
    "redacted_block",
    "signature_valid",
    "thinking_block",
]

_KEY = b"anabranch.testing thinking signatures v1"
ThinkingLike = ThinkingBlock | RedactedThinkingBlock


def _digest(kind: bytes, payload: str) -> str:
    mac = hmac.new(_KEY, kind + b"\x00" + payload.encode(), hashlib.sha256).digest()
    return base64.b64encode(mac).decode()


def _binding(prefix: str, payload: str) -> str:
    return f"|{prefix}|{_digest(b'binding', prefix + payload)}"


def thinking_block(thinking: str, prefix: str | None = None) -> ThinkingBlock:
    """A thinking block carrying a signature the local server accepts (bound to
    ``prefix``, a ``prefix_digest``, when given)."""
    signature = _digest(b"thinking", thinking)
    if prefix is not None:
        signature += _binding(prefix, thinking)
    return ThinkingBlock(thinking=thinking, signature=signature)


def redacted_block(payload: str, prefix: str | None = None) -> RedactedThinkingBlock:
    """A redacted thinking block whose opaque ``data`` the local server accepts."""
    body = base64.b64encode(payload.encode()).decode()
    data = f"{body}.{_digest(b'redacted', body)}"
    if prefix is not None:
        data += _binding(prefix, body)
    return RedactedThinkingBlock(data=data)


def _parts(block: ThinkingLike) -> tuple[str, str, str | None, str | None]:
    """(payload, its mac, bound prefix, binding mac) of ``block``."""
    sealed = block.signature if isinstance(block, ThinkingBlock) else block.data
    head, *tail = sealed.split("|")
    prefix, mac = (tail[0], tail[1]) if len(tail) == 2 else (None, None)
    if isinstance(block, ThinkingBlock):
        return block.thinking, head, prefix, mac
    body, _, body_mac = head.rpartition(".")
    return body, body_mac, prefix, mac


def signature_valid(block: ThinkingLike) -> bool:
    """Whether ``block`` is exactly as one of ours was issued."""
    sealed = block.signature if isinstance(block, ThinkingBlock) else block.data
    if sealed.count("|") not in (0, 2):
        return False
    payload, mac, prefix, binding = _parts(block)
    if isinstance(block, ThinkingBlock):
        valid = hmac.compare_digest(mac, _digest(b"thinking", payload))
    else:
        valid = bool(payload) and hmac.compare_digest(mac, _digest(b"redacted", payload))
    if not valid or prefix is None or binding is None:
        return valid
    return hmac.compare_digest(binding, _digest(b"binding", prefix + payload))


def bound_prefix(block: ThinkingLike) -> str | None:
    """The prefix digest ``block`` is bound to (``None``: unbound)."""
    return _parts(block)[2]


def bind(block: ThinkingLike, prefix: str) -> ThinkingLike:
    """``block`` signed again, bound to ``prefix`` (what the server does to each thinking
    block it returns on a model with preserved thinking)."""
    if isinstance(block, ThinkingBlock):
        return thinking_block(block.thinking, prefix)
    body = _parts(block)[0]
    return RedactedThinkingBlock(
        data=f"{body}.{_digest(b'redacted', body)}{_binding(prefix, body)}"
    )


def prompt_state(system: Sequence[SystemBlock], tools: Sequence[ToolDefinition]) -> str:
    """The start of every prefix chain: the system texts and the tool definitions."""
    payload = canonical_json(
        [[b.text for b in system], [[t.name, t.description, t.input_schema] for t in tools]]
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def chained(state: str, message: Message) -> str:
    """The chain ``state`` extended by one more message."""
    payload = state + canonical_json(message.model_dump(mode="json"))
    return hashlib.sha256(payload.encode()).hexdigest()


def sealed(state: str, partial: Sequence[Block] = ()) -> str:
    """The prefix digest of a block after the chain ``state`` and the blocks before it in
    its own message."""
    payload = state + canonical_json([b.model_dump(mode="json") for b in partial])
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def prefix_digest(
    system: Sequence[SystemBlock],
    tools: Sequence[ToolDefinition],
    messages: Sequence[Message],
    partial: Sequence[Block] = (),
    *,
    start: str | None = None,
) -> str:
    """What precedes a block: the system texts, the tool definitions, every earlier
    message and the blocks before it in its own message (cache marks are not content).
    ``start`` is a chain state to continue from instead (a compaction's)."""
    state = start if start is not None else prompt_state(system, tools)
    for message in messages:
        state = chained(state, message)
    return sealed(state, partial)


# -- compaction blocks ---------------------------------------------------------------------
def compaction_signature(summary: str, prompt: str, state: str, last_role: str) -> str:
    """The signature of a compaction block: it vouches for the summary and records the
    chain state of what it summarized (so kept turns' thinking stays valid), the prompt it
    was made under and the role of the last summarized message."""
    mac = _digest(b"compaction", "|".join((summary, prompt, state, last_role)))
    return f"{mac}|{prompt}|{state}|{last_role}"


def compaction_record(summary: str, signature: str) -> tuple[str, str, str] | None:
    """(prompt state, chain state, last role) a valid compaction signature records, or
    ``None`` when the signature is not one we issued for ``summary``."""
    parts = signature.split("|")
    if len(parts) != 4:
        return None
    mac, prompt, state, last_role = parts
    expected = _digest(b"compaction", "|".join((summary, prompt, state, last_role)))
    if not hmac.compare_digest(mac, expected) or last_role not in ("user", "assistant"):
        return None
    return prompt, state, last_role


def compaction_content(block: Block) -> tuple[str | None, str | None] | None:
    """(content, signature) of a ``compaction`` block (``None``: not one)."""
    if not isinstance(block, RawBlock) or block.block.get("type") != "compaction":
        return None
    content, signature = block.block.get("content"), block.block.get("signature")
    return (
        content if isinstance(content, str) else None,
        signature if isinstance(signature, str) else None,
    )


def leading_compaction(messages: Sequence[Message]) -> tuple[str, str, str] | None:
    """What the compaction block opening ``messages`` records (``None``: no valid one)."""
    if not messages or not messages[0].content:
        return None
    found = compaction_content(messages[0].content[0])
    if found is None or found[0] is None or found[1] is None:
        return None
    return compaction_record(found[0], found[1])


def request_chain(
    system: Sequence[SystemBlock], tools: Sequence[ToolDefinition], messages: Sequence[Message]
) -> tuple[str, int]:
    """Where the prefix chain of ``messages`` starts: (state, index of the first message
    it covers). After an API-written summary the chain goes on from the state the
    summarized messages had, so kept turns' thinking stays valid: while the system prompt
    and the tools are what they were when the summary was made."""
    prompt = prompt_state(system, tools)
    record = leading_compaction(messages)
    if record is None:
        return prompt, 0
    made_under, state, _ = record
    if made_under != prompt:
        state = hashlib.sha256(f"prompt changed|{made_under}|{prompt}|{state}".encode()).hexdigest()
    return state, 1
