"""Compaction on demand (beta ``compact-2026-09-04``) in the local server.

A request with the ``compaction`` parameter is answered with one signed ``compaction``
block and ``stop_reason: "compaction"``; nothing is sampled after it. The summary itself is
asked of the server's policy (any ``Model``) as a summary request, so a ``TestModel``
answers it as it answers our own summarizer. The block's signature records the prefix
chain of what it summarized (see ``_signing``): kept turns that follow it unchanged keep
valid thinking on the models with preserved thinking, as the API documents.
"""

from __future__ import annotations

import re
from dataclasses import replace

from anabranch.messages import Message, ModelRequest, ModelResponse, ModelSettings, RawBlock
from anabranch.testing._models import SUMMARY_TAG
from anabranch.testing._signing import chained, compaction_signature, prompt_state, request_chain
from anabranch.testing._wire import WireRequest

__all__ = ["DEFAULT_INSTRUCTIONS", "compaction_response", "compaction_wire"]

DEFAULT_INSTRUCTIONS = (
    "Summarize the conversation so far so that the work can continue from the summary "
    f"alone: the task, what was found, what is left. Write it inside {SUMMARY_TAG} tags."
)
_SUMMARY = re.compile(r"<summary>\s*(.*?)\s*</summary>", re.DOTALL)


def compaction_wire(wire: WireRequest) -> WireRequest:
    """The request the policy is asked for the summary: the conversation, then the
    summarization prompt (the server's, or the request's ``instructions``)."""
    request = wire.request
    prompt = wire.compaction_instructions or DEFAULT_INSTRUCTIONS
    if SUMMARY_TAG not in prompt:
        prompt += f"\n\nWrite the summary inside {SUMMARY_TAG} tags."
    asked = request.model_copy(
        update={
            "messages": (*request.messages, Message.user(prompt)),
            "settings": ModelSettings(),
            "message_breakpoints": (),
        }
    )
    return replace(wire, request=asked, compaction=False, cache_marks={}, salt="")


def compaction_response(request: ModelRequest, answer: ModelResponse) -> ModelResponse:
    """The compaction block for ``request`` made of the policy's ``answer``."""
    text = "".join(b.text for b in answer.content if b.type == "text").strip()
    found = _SUMMARY.search(text)
    summary = (found.group(1) if found else text).strip()
    block: dict[str, object] = {"type": "compaction", "content": summary or None}
    if summary:
        state, first = request_chain(request.system, request.tools, request.messages)
        for message in request.messages[first:]:
            state = chained(state, message)
        prompt = prompt_state(request.system, request.tools)
        last = request.messages[-1].role
        block["signature"] = compaction_signature(summary, prompt, state, last)
    return answer.model_copy(
        update={"content": (RawBlock(block=block),), "stop_reason": "compaction"}
    )
