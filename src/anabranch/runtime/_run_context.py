"""``RunContext``: a run's committed context, and the one place it changes (part of the loop).

Mixed into ``AgentRun``. Messages join the context only once committed (``append``,
``continue_with``); a context pipeline's decision (a ``ContextChange``) is committed and
swapped in only by ``pipeline_step``: each boundary with its spills and derived rows, in
order, so every boundary is durable before a request is built from its context; then the
prompt snapshot is rebuilt if a compaction asked for it. ``AgentRun`` is the
``ContextView`` a pipeline reads (every member it needs is here or on the loop).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TypeVar

import anyio
from anyio.abc import TaskGroup

from anabranch.agents import Agent, ContextPolicy
from anabranch.context._tokens import estimate_messages, estimate_request
from anabranch.errors import CompactionFailedError
from anabranch.messages import Message, ModelRequest, ModelResponse, ToolResultBlock, Usage
from anabranch.runtime._context_view import (
    BoundaryCommit,
    CompactionOutcome,
    ContextChange,
    ContextView,
)
from anabranch.runtime._environment import Environment
from anabranch.runtime._history import message_records
from anabranch.runtime._thinking_view import floor_after_compaction as floor_after
from anabranch.store import MessageRecord, RunRecord, Store

__all__ = ["PipelineStep", "RunContext", "commit_change"]

T = TypeVar("T")

PipelineStep = Callable[[ContextView], Awaitable[ContextChange | None]]
"""One pipeline decision over a run's view (``before_call``, a manual ``compact``...)."""


async def commit_change(store: Store, change: ContextChange) -> list[tuple[BoundaryCommit, int]]:
    """Persist ``change``'s boundaries in order (each one's spills first, then the row with
    its derived messages in one transaction); each commit with its boundary id."""
    done = []
    for commit in change.commits:
        boundary = commit.boundary
        for spill in commit.spills:
            await store.save_spill(spill.handle, boundary.run_id, spill.call_id, spill.content)
        done.append((commit, await store.add_boundary(boundary, commit.rows)))
    return done


class RunContext:
    """The committed context of one agent run (mixed into ``AgentRun``, which sets these)."""

    env: Environment
    agent: Agent
    record: RunRecord
    id: str
    context: list[Message]
    next_seq: int
    turns: int
    turn_base: int
    compactions: int
    thinking_floor: int
    """Leading context messages produced under an earlier prefix (``_thinking_view``)."""
    background: TaskGroup | None
    served_model: str | None
    last_usage: Usage | None
    appended_since_usage: list[Message]
    committed_results: dict[str, ToolResultBlock]
    """The latest tool calls' results as their finished events hold them (a message block
    equal to one is stored as a reference to its event: the output is stored once)."""
    undriven: bool = False
    """This object created the run and has not driven it yet: no earlier drive exists."""

    def build_request(
        self,
        *,
        tool_choice: str | None = None,
        max_tokens: int | None = None,
        context: Sequence[Message] | None = None,
    ) -> ModelRequest:
        raise NotImplementedError

    async def rebuild_snapshot(self, reason: str) -> bool:
        raise NotImplementedError

    async def request_once(
        self, request: ModelRequest, *, attempt: int, purpose: str | None = None
    ) -> ModelResponse:
        raise NotImplementedError

    def with_retries(self, attempt: Callable[[int], Awaitable[T]]) -> Awaitable[T]:
        raise NotImplementedError

    # ------------------------------------------------------------------ accounting
    @property
    def context_tokens(self) -> int:
        """Anchored on the last response's usage, plus an estimate of what came after."""
        if self.last_usage is None:
            return estimate_request(self.build_request())
        anchored = self.last_usage.total_input_tokens + self.last_usage.output_tokens
        return anchored + estimate_messages(self.appended_since_usage)

    _threshold_of: ContextPolicy | None = None
    _threshold = 0

    @property
    def threshold(self) -> int:
        """The policy's threshold, worked out once per policy object (frozen: its fields
        never change) instead of before every call."""
        policy = self.agent.context
        if policy is not self._threshold_of:
            self._threshold, self._threshold_of = policy.threshold, policy
        return self._threshold

    def estimate_tokens(self, context: Sequence[Message]) -> int:
        """What ``context_tokens`` will be once ``context`` is swapped in (no usage yet)."""
        return estimate_request(self.build_request(context=context))

    def clearable(self, tool_name: str) -> bool:
        """Whether old results of ``tool_name`` may be cleared: the tool's own
        ``clearable`` (a built-in's ``clearable`` attribute; default ``True``); a pinned
        tool's results are never cleared."""
        tool = self.agent.tool(tool_name)
        if tool is not None:
            return tool.clearable and not tool.pin
        builtin = next((b for b in self.env.builtins if b.name == tool_name), None)
        return bool(getattr(builtin, "clearable", True))

    @property
    def channel(self) -> str | None:
        """The channel the run's model calls go through (a base URL, a cloud), if known."""
        channel = getattr(self.env.model, "channel", None)
        return channel if isinstance(channel, str) else None

    @property
    def configured_window(self) -> int | None:
        """The window the model client says its channel enforces, if configured."""
        window = getattr(self.env.model, "context_window", None)
        return window if isinstance(window, int) else None

    # ------------------------------------------------------------------ appending
    def message_records(
        self, messages: Sequence[Message], kind: str = "message"
    ) -> list[MessageRecord]:
        """Store records for ``messages`` appended after the last committed one."""
        return message_records(self.id, self.next_seq, messages, kind, self.committed_results)

    async def append(self, *messages: Message, kind: str = "message") -> None:
        """Commit messages to the store, then add them to the context."""
        records = self.message_records(messages, kind)
        await self.env.store.append_messages(records)
        for message in messages:
            self.appended(message)

    def appended(self, message: Message) -> None:
        """Add ``message``, just committed (after the last committed one), to the context."""
        self.next_seq += 1
        self.context.append(message)
        self.appended_since_usage.append(message)

    async def continue_with(self, text: str) -> None:
        """A conversation's next turn: reopen the finished run with a new user message
        (committed before anything else happens)."""
        messages = [Message.user(text)]
        await self.env.store.continue_run(self.id, self.message_records(messages))
        self.record = replace(self.record, status="running", output=None, finished=None)
        self.next_seq += 1
        self.context.extend(messages)
        self.appended_since_usage.extend(messages)
        self.turn_base = self.turns

    # ------------------------------------------------------------------ pipeline
    async def pipeline_step(self, step: PipelineStep) -> CompactionOutcome:
        """Run one pipeline decision over this run's view and commit what it returns.

        The one place a run's context is replaced (see the module docstring). A change
        that fails the run (the breaker under ``on_compaction_failure="fail"``) does so
        after its commits, raising ``CompactionFailedError``.
        """
        change = await step(self.context_view())
        if change is None:
            return CompactionOutcome(applied=False)
        boundary_id = None
        for commit, committed_id in await commit_change(self.env.store, change):
            if commit.context is not None and commit.next_seq is not None:
                boundary_id = committed_id
                self.next_seq = commit.next_seq
                self.thinking_floor = floor_after(self.context, commit.context, self.thinking_floor)
                self.context = list(commit.context)
                self.last_usage = None
                self.appended_since_usage = list(commit.context)
                self.compactions += 1
        if change.fail_run is not None:
            error = CompactionFailedError(change.fail_run)
            await self.env.store.finish_run(self.id, "failed", error=str(error))
            error.session_id = self.env.session_id
            raise error
        if change.rebuild_prompt:
            await self.rebuild_snapshot("compaction")
        return CompactionOutcome(change.applied, boundary_id, change.failure)

    def context_view(self) -> ContextView:
        """This run as the read-only view a context pipeline receives."""
        raise NotImplementedError

    async def call_summarizer(
        self, request: ModelRequest, *, purpose: str = "compaction"
    ) -> ModelResponse:
        """One summarizer request, retried like any model call, traced as a child span."""

        async def attempt(n: int) -> ModelResponse:
            return await self.request_once(request, attempt=n, purpose=purpose)

        return await self.with_retries(attempt)

    async def alongside(self, body: Callable[[], Awaitable[T]]) -> T:
        """``body()`` with ``background`` set to a task group for as long as it runs (a
        pipeline's work ahead lives there); what is still running in it when ``body``
        ends is cancelled, and it committed nothing. ``body``'s own error is raised as it
        is, not wrapped in an exception group (the group's tasks never raise)."""
        try:
            async with anyio.create_task_group() as group:
                self.background = group
                try:
                    return await body()
                finally:
                    self.background = None
                    group.cancel_scope.cancel()
        except BaseExceptionGroup as errors:
            if len(errors.exceptions) == 1:
                error = errors.exceptions[0]
                raise error from error.__cause__  # as it was raised, cause and all
            raise
        raise AssertionError("unreachable: the task group returned without a result")
