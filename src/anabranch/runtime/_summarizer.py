"""The summarizer: one request when the range fits its budget, otherwise parts in order.

Nothing of the range is ever left out to make it fit: a range over the budget is rendered
as text (``context.transcript``) and summarized part by part, each request carrying the
summary so far. Every request that was sent is kept in ``SummaryResult.requests`` (the
no-silent-loss check reads them). The model, then the fallback model, are asked in turn;
a ``prompt is too long`` answer halves the budget and starts again in smaller parts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from anabranch.context._compaction import (
    SummaryError,
    extract_summary,
    summary_part_request,
    summary_request,
)
from anabranch.context._tokens import estimate_messages
from anabranch.context._transcript import chars_for_tokens, transcript_parts
from anabranch.errors import ModelError, PromptTooLongError
from anabranch.messages import Message, ModelRequest, ModelResponse, Usage

__all__ = ["SummarizerFailed", "SummaryResult", "summarize", "summary_max_tokens"]

MIN_PART_TOKENS = 256
"""A budget below this cannot hold a useful part: the summarizer has failed."""
ATTEMPTS_PER_MODEL = 4


def summary_max_tokens(threshold: int, agent_max_tokens: int) -> int:
    """Output budget of a summary: at most a quarter of the threshold."""
    return max(64, min(agent_max_tokens, threshold // 4))


class SummarizerFailed(Exception):
    """No model produced a summary; the message lists every attempt's error."""


@dataclass
class SummaryResult:
    summary: str
    model: str
    usage: Usage
    requests: list[ModelRequest] = field(default_factory=list)
    parts: int = 1


async def summarize(
    head: Sequence[Message],
    *,
    models: Sequence[str],
    budget: int,
    budgets: Mapping[str, int] | None = None,
    build: Callable[[str, list[Message]], ModelRequest],
    call: Callable[[ModelRequest], Awaitable[ModelResponse]],
    instructions: str | None = None,
    labels: Sequence[str | None] | None = None,
    max_summary_tokens: int = 1024,
) -> SummaryResult:
    """Summarize ``head`` within ``budget`` tokens of messages per request.

    ``budgets`` overrides ``budget`` for some models (one with a larger window).
    ``build(model, messages)`` makes the request (system, tools, breakpoints);
    ``call`` sends it. ``labels`` name each message in a parted transcript (``msg-N``).
    """
    errors: list[str] = []
    sent: list[ModelRequest] = []
    for model in models:
        room = (budgets or {}).get(model, budget)
        for _ in range(ATTEMPTS_PER_MODEL):
            if room < MIN_PART_TOKENS:
                errors.append(f"{model}: the summarizer's budget ({room} tokens) is too small")
                break
            try:
                return await _one_pass(
                    head,
                    model,
                    room,
                    build,
                    call,
                    instructions,
                    labels,
                    sent,
                    max_summary_tokens,
                )
            except PromptTooLongError as exc:
                errors.append(f"{model}: {exc}")
                room //= 2
                if exc.maximum:
                    room = min(room, exc.maximum // 2)
            except SummaryError as exc:
                errors.append(f"{model}: {exc}")
                break
            except ModelError as exc:
                errors.append(f"{model}: {type(exc).__name__}: {exc}")
                break
    raise SummarizerFailed("summarizer failed: " + " | ".join(errors))


async def _one_pass(
    head: Sequence[Message],
    model: str,
    room: int,
    build: Callable[[str, list[Message]], ModelRequest],
    call: Callable[[ModelRequest], Awaitable[ModelResponse]],
    instructions: str | None,
    labels: Sequence[str | None] | None,
    sent: list[ModelRequest],
    max_summary_tokens: int,
) -> SummaryResult:
    if estimate_messages(head) <= room:
        request = build(model, summary_request(head, instructions))
        sent.append(request)
        response = await call(request)
        summary = extract_summary(response.to_message().text)
        return SummaryResult(summary, model, response.usage, list(sent))
    # the running summary takes at most max_summary_tokens of each request
    part_tokens = max(MIN_PART_TOKENS // 2, room - max_summary_tokens - 200)
    parts = transcript_parts(head, chars_for_tokens(part_tokens), labels)
    running = ""
    usage = Usage()
    for index, part in enumerate(parts, start=1):
        request = build(model, summary_part_request(running, part, index, len(parts), instructions))
        sent.append(request)
        response = await call(request)
        usage = usage + response.usage
        running = extract_summary(response.to_message().text)
    return SummaryResult(running, model, usage, list(sent), parts=len(parts))
