"""How a compaction asks for its summary: the policy's ``on_compact`` hook for extra
instructions, the summarizer's requests sized to the run's window (in parts, see
``_summarizer``), and each summarizer call (a ``prompt is too long`` answer teaches the
channel's limit). Plain functions of the run and of the pipeline's sizes (``Sizing``).
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

from anabranch.context._compaction import CompactionEvent, Split
from anabranch.context._content import drop_thinking
from anabranch.context._tokens import estimate_messages, estimate_request
from anabranch.errors import PromptTooLongError
from anabranch.messages import Message, ModelRequest, ModelResponse
from anabranch.runtime._context_view import ContextView
from anabranch.runtime._limits import ChannelLimits
from anabranch.runtime._model_switch import ModelSwitch
from anabranch.runtime._run_prompt import with_breakpoints
from anabranch.runtime._summarizer import summarize, summary_max_tokens

__all__ = ["Sizing", "call_summarizer", "fixed_tokens", "pre_compact_hook", "summarize_head"]


class Sizing(Protocol):
    """What of ``CompactingPipeline`` sizes a summary: the run's window and threshold (both
    follow the limits it learned), and those limits."""

    limits: ChannelLimits

    def window(self, run: ContextView) -> int: ...

    def threshold(self, run: ContextView) -> int: ...


async def pre_compact_hook(
    pipeline: Sizing, run: ContextView, split: Split, strategy: str, trigger: str
) -> str | None:
    """The policy's ``on_compact`` hook, told what is about to be compacted: the extra
    instructions it returns for the summary, or ``None``."""
    policy = run.agent.context
    if policy.on_compact is None:
        return None
    event = CompactionEvent(
        agent=run.agent.name,
        session_id=run.session_id,
        run_id=run.id,
        trigger=trigger,
        strategy=strategy,
        messages=split.head,
        kept=((split.carry,) if split.carry else ()) + split.tail,
        tokens=run.context_tokens,
        threshold=pipeline.threshold(run),
        window=pipeline.window(run),
    )
    result = policy.on_compact(event)
    if inspect.isawaitable(result):
        result = await result
    return result if isinstance(result, str) else None


def fixed_tokens(run: ContextView) -> int:
    """Estimated tokens of the system prompt and tool definitions."""
    empty = ModelRequest(model=run.agent.model, system=run.system, tools=run.tools, messages=())
    return estimate_request(empty)


async def summarize_head(
    pipeline: Sizing,
    run: ContextView,
    head: tuple[Message, ...],
    seqs: list[int | None],
    instructions: str | None,
    *,
    switch: ModelSwitch | None = None,
    purpose: str = "compaction",
) -> Any:
    """Ask the summarizer (then the fallback) for a summary of ``head``, in parts if
    it does not fit the summarizer's window; after a model switch, the previous model
    first, with room for the whole head (it held this context)."""
    policy = run.agent.context
    models = [policy.summarizer_model or run.agent.model]
    if policy.fallback_summarizer_model and policy.fallback_summarizer_model not in models:
        models.append(policy.fallback_summarizer_model)
    window = pipeline.window(run)
    max_tokens = summary_max_tokens(pipeline.threshold(run), run.agent.max_tokens)
    budget = window - max_tokens - fixed_tokens(run) - window // 20
    budgets = {}
    if switch is not None:
        models = [switch.previous, *(m for m in models if m != switch.previous)]
        budgets[switch.previous] = max(budget, estimate_messages(head) + 1)

    def build(model: str, messages: list[Message]) -> ModelRequest:
        return with_breakpoints(
            run.agent,
            ModelRequest(
                model=model,
                system=run.system,
                tools=run.tools,
                messages=tuple(messages),
                max_tokens=max_tokens,
            ),
        )

    # the summarizer does not think: earlier thinking is omitted, never altered
    return await summarize(
        drop_thinking(head),
        models=models,
        budget=budget,
        budgets=budgets,
        build=build,
        call=lambda request: call_summarizer(pipeline, run, request, purpose),
        instructions=instructions,
        labels=[f"msg-{s}" if s is not None else None for s in seqs],
        max_summary_tokens=max_tokens,
    )


async def call_summarizer(
    pipeline: Sizing, run: ContextView, request: ModelRequest, purpose: str = "compaction"
) -> ModelResponse:
    """One summarizer call (the run's summarizer retries and traces it)."""
    try:
        return await run.call_summarizer(request, purpose=purpose)
    except PromptTooLongError as exc:  # teach the channel's limit, then smaller parts
        await pipeline.limits.learn(
            run, exc, model=request.model, estimate=estimate_request(request)
        )
        raise
