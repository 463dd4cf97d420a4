"""A request turned into a compaction request (the API's compaction on demand).

Kept apart from ``_anthropic``: the runtime's server-compaction step builds this request
for whatever model it runs with, and importing the anthropic SDK (thousands of modules,
~150k objects that every full garbage collection then walks) only for this function made
every process pay for the SDK even when no Anthropic model was used.
"""

from __future__ import annotations

from anabranch.messages import ModelRequest

__all__ = ["compaction_request"]


def compaction_request(request: ModelRequest, instructions: str | None = None) -> ModelRequest:
    """``request`` as a compaction request: the ``compaction`` parameter travels in the
    settings' extra body (SDK 2.x names it only on its beta surface)."""
    compaction: dict[str, str] = {"type": "summarize"}
    if instructions and instructions.strip():
        compaction["instructions"] = instructions
    body = {**request.settings.extra_body, "compaction": compaction}
    return request.model_copy(
        update={"settings": request.settings.model_copy(update={"extra_body": body})}
    )
