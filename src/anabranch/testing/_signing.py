"""Signatures of the thinking blocks the local server and the test models emit.

The real API signs each thinking block and refuses one whose text or signature changed.
These signatures do the same job offline: a keyed digest of the thinking text (and of a
redacted block's payload), stable across processes, so a resumed session verifies.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from anabranch.messages import RedactedThinkingBlock, ThinkingBlock

__all__ = ["redacted_block", "signature_valid", "thinking_block"]

_KEY = b"anabranch.testing thinking signatures v1"


def _digest(kind: bytes, payload: str) -> str:
    mac = hmac.new(_KEY, kind + b"\x00" + payload.encode(), hashlib.sha256).digest()
    return base64.b64encode(mac).decode()


def thinking_block(thinking: str) -> ThinkingBlock:
    """A thinking block carrying a signature the local server accepts."""
    return ThinkingBlock(thinking=thinking, signature=_digest(b"thinking", thinking))


def redacted_block(payload: str) -> RedactedThinkingBlock:
    """A redacted thinking block whose opaque ``data`` the local server accepts."""
    body = base64.b64encode(payload.encode()).decode()
    return RedactedThinkingBlock(data=f"{body}.{_digest(b'redacted', body)}")


def signature_valid(block: ThinkingBlock | RedactedThinkingBlock) -> bool:
    """Whether ``block`` is exactly as one of ours was issued."""
    if isinstance(block, ThinkingBlock):
        return hmac.compare_digest(block.signature, _digest(b"thinking", block.thinking))
    body, _, mac = block.data.rpartition(".")
    return bool(body) and hmac.compare_digest(mac, _digest(b"redacted", body))
