"""``strategy="server"``: the Messages API writes the summary (compaction on demand, beta
``compact-2026-09-04``).

The run's oldest turns, up to a reply of the model, are sent as a compaction request; the
answer is one signed ``compaction`` block, which opens the new context in place of those
turns, followed by the kept turns *unchanged*. That is what the API needs to keep the kept
turns' thinking valid on the models with preserved thinking (a summary of our own would
rewrite their prefix): so the run's thinking floor moves with the split instead of covering
the whole context (``_thinking_view``).

The block is kept as a ``RawBlock`` (exactly as the API returned it) in a message of the
role of the last summarized turn, so the context still alternates and the first kept turn
has the other role, as the API requires. The boundary, its loss manifest (the summary is
readable text) and the compact span are the compactor's, as for every strategy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from anabranch.context._compaction import Rebuilt, context_violations, split_points
from anabranch.context._content import content_violations
from anabranch.context._digest import Manifest, manifest
from anabranch.context._tokens import estimate_messages
from anabranch.messages import Message, ModelRequest, RawBlock
from anabranch.models._compaction_request import compaction_request
from anabranch.runtime._context_view import ContextView
from anabranch.runtime._head import handles_in
from anabranch.runtime._run_prompt import with_breakpoints
from anabranch.runtime._summarizer import SummarizerFailed
from anabranch.runtime._thinking_view import is_server_opening, request_messages

__all__ = ["server_rebuild", "server_split"]


def server_split(
    context: Sequence[Message], *, keep_recent: int, max_tail_tokens: int
) -> int | None:
    """Where to cut for a server compaction: before a reply of the model (so the last
    summarized turn is a user turn and the first kept one the model's), keeping at most
    ``keep_recent`` messages and ``max_tail_tokens``; else the split keeping fewest."""
    points = [p for p in split_points(context) if context[p].role == "assistant"]
    if points and points[0] == 1 and is_server_opening(context[0]):
        points.pop(0)  # replacing only the previous summary gains nothing
    if not points:
        return None
    for index in points:
        tail_tokens = estimate_messages(context[index:])
        if len(context) - index <= keep_recent and tail_tokens <= max_tail_tokens:
            return index
    return points[-1]


async def server_rebuild(
    view: ContextView,
    level: int,
    max_tail_tokens: int,
    seqs: list[int | None],
    details: dict[str, Any],
) -> tuple[Rebuilt, Manifest]:
    """The context after a server compaction of ``view`` (``details`` get what the
    boundary records: model, summary, usage, the new thinking floor)."""
    context = tuple(view.context)
    index = server_split(
        context,
        keep_recent=view.agent.context.keep_recent >> level,
        max_tail_tokens=max_tail_tokens,
    )
    if index is None:
        raise SummarizerFailed("nothing to compact: no earlier reply of the model to cut before")
    sent = request_messages(view.agent.model, context, view.thinking_floor)
    request = with_breakpoints(
        view.agent,
        ModelRequest(
            model=view.agent.model,
            system=view.system,
            tools=view.tools,
            messages=tuple(sent[:index]),
            max_tokens=view.agent.max_tokens,
            settings=view.agent.model_settings,
        ),
    )
    response = await view.call_summarizer(compaction_request(request))
    block = next(
        (
            b
            for b in response.content
            if isinstance(b, RawBlock) and b.block.get("type") == "compaction"
        ),
        None,
    )
    if block is None:
        raise SummarizerFailed(
            "strategy='server' needs a model that compacts on the server (AnthropicModel): "
            "the answer held no compaction block"
        )
    summary = block.block.get("content")
    if not isinstance(summary, str) or not summary.strip():
        raise SummarizerFailed("the API's compaction produced no summary")
    head, tail = context[:index], context[index:]
    opening = Message(role=head[-1].role, content=(block,))
    rebuilt = Rebuilt(
        messages=(opening, *tail), sources=(None, *range(index, len(context))), kept=len(tail)
    )
    problems = context_violations(rebuilt.messages)
    thinking = view.agent.model_settings.thinking
    problems += content_violations(context, rebuilt.messages, thinking=thinking)
    if problems:
        raise SummarizerFailed("invalid compacted context: " + "; ".join(problems))
    found = manifest(head, seqs[:index], summary, handles=handles_in(head), summary=summary)
    details.update(
        model=response.model or request.model,
        summary=summary,
        usage=response.usage.model_dump(mode="json"),
        manifest=found.as_dict(),
        thinking_floor=1 + max(0, view.thinking_floor - index),
    )
    return rebuilt, found
