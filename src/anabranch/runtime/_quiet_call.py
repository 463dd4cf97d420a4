"""Whether the compacting pipeline's ``before_call`` has nothing to do for a run now.

Decided by plain functions, so the loop can ask in the step in which a tool turn's last
result returned and commit the next call's row with it (``runtime._tool_calls``). Each
test mirrors a branch of ``CompactingPipeline.before_call``: anything it would load,
clear, compact, swap in or start makes the answer ``False`` and the loop calls it as usual.
"""

from __future__ import annotations

from typing import Protocol

from anabranch.runtime._ahead import AheadSummaries
from anabranch.runtime._compaction_step import CompactionStep
from anabranch.runtime._context_view import ContextView
from anabranch.runtime._limits import ChannelLimits
from anabranch.runtime._model_switch import ModelSwitch

__all__ = ["quiet_before_call"]


class _Compacting(Protocol):
    limits: ChannelLimits
    ahead: AheadSummaries

    def window(self, run: ContextView) -> int: ...

    def threshold(self, run: ContextView) -> int: ...

    def model_switch(self, run: ContextView) -> ModelSwitch | None: ...


def quiet_before_call(pipeline: _Compacting, run: ContextView) -> bool:
    """``True`` if ``pipeline.before_call(run)`` would await, start and change nothing.

    Nothing is decided yet, so the run reads as ``before_call``'s fresh ``CompactionStep``
    of it would (one is built only to ask about a summary ahead); its token count is
    worked out once."""
    if not pipeline.limits.prepared(run):  # it would read the store's learned limit
        return False
    policy = run.agent.context
    tokens = run.context_tokens
    if policy.clear_tool_results_after is not None and tokens > pipeline.window(run) * (
        policy.clear_at
    ):
        return False  # it would try clearing old results
    if pipeline.model_switch(run) is not None:
        return False
    threshold = pipeline.threshold(run)
    if tokens >= threshold:
        return False  # it would compact (or wait for the summary ahead)
    if policy.compact_ahead_at is None:
        return True  # no summary ahead is ever started for this run: none to swap in
    ahead = pipeline.ahead.pending(run)
    if ahead is not None and ahead.ready.is_set():
        return False  # it would swap the summary computed ahead in
    return not pipeline.ahead.due(CompactionStep(run), threshold=threshold)  # or start one
