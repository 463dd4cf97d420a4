"""``ModelCalls``: one model turn's call under the write-ahead protocol (part of the loop).

Mixed into ``AgentRun``. Each attempt commits its call row before the request leaves the
process, sends it inside its own ``chat`` span, and commits the answer (the assistant
message, its usage, the ``started`` marks of the tools it asks for) in one transaction
inside that span; a failed attempt is committed as such and retried under the session's
retry policy.

What an attempt holds while it waits for the model lives as long as that wait (a model's
latency, far longer than the cyclic GC's young generations): it is kept to the objects
the call needs (no closure, ``partial`` or bound method per call where a plain argument
does).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, TypeVar

import anyio

from anabranch.agents import Agent
from anabranch.errors import ModelError, PromptTooLongError
from anabranch.messages import (
    Message,
    ModelRequest,
    ModelResponse,
    ToolDefinition,
    ToolUseBlock,
    Usage,
)
from anabranch.models._base import StreamingModel
from anabranch.models._retry import retrying
from anabranch.runtime._context_view import CompactionOutcome, ContextView
from anabranch.runtime._environment import Environment
from anabranch.runtime._history import message_json, usage_json
from anabranch.runtime._run_events import RunEvents
from anabranch.runtime._run_limits import LimitStop, SessionLimits
from anabranch.runtime._session_view import UsageTotals
from anabranch.store import CallRecord, MessageRecord, RunRecord, ToolEventRecord
from anabranch.traces import close_span

if TYPE_CHECKING:
    from anabranch.runtime._run_context import PipelineStep

__all__ = ["ModelCalls"]

T = TypeVar("T")

_CALL_ID = attrgetter("call_id")


class ModelCalls:
    """Model calls of one agent run (mixed into ``AgentRun``, which sets these)."""

    env: Environment
    agent: Agent
    record: RunRecord
    id: str
    limits: SessionLimits
    tools: tuple[ToolDefinition, ...]
    context: list[Message]
    events: RunEvents
    turns: int
    turn_base: int
    compactions: int
    snapshot_version: int
    next_seq: int
    last_response_id: str | None
    last_usage: Usage | None
    appended_since_usage: list[Message]
    own_usage: UsageTotals | None
    """A run started here: its calls' usage, summed (see ``AgentRun``)."""
    served_model: str | None
    _fresh_tools: tuple[Message, list[ToolUseBlock], frozenset[str]] | None
    _quiet_call: Callable[[object, ContextView], bool] | None
    """The pipeline's ``quiet_before_call`` (``plain_twin``: called with the pipeline),
    found once per run."""
    stop: LimitStop | None
    ended_with_answer: bool = False
    """The latest answer's call committed the run's end (``done``, its text as output)."""
    begun: tuple[ModelRequest, CallRecord, int] | None = None
    """The next call's request and its row (by id), committed with the tool turn's last
    result (``begin_next_call_now``): its first attempt sends exactly that request."""

    if TYPE_CHECKING:  # the loop's and ``ToolCalls``' (they come after this class)

        def build_request(
            self, *, tool_choice: str | None = None, max_tokens: int | None = None
        ) -> ModelRequest: ...

        def context_view(self) -> ContextView: ...

        async def rebuild_snapshot(self, reason: str) -> bool: ...

        async def pipeline_step(self, step: PipelineStep) -> CompactionOutcome: ...

        def _started_events(self, uses: Sequence[ToolUseBlock]) -> list[ToolEventRecord]: ...

        def after_response(
            self, call_id: int, call: CallRecord, response: ModelResponse
        ) -> Awaitable[None] | None: ...

    async def take_turn(
        self, *, tool_choice: str | None = None, max_tokens: int | None = None
    ) -> ModelResponse:
        """One model turn: the context pipeline, the call (committed before each attempt,
        retried under the session's retry policy), the context updated.

        The retry loop is this coroutine's own (the rule is the policy's ``retry_delay``,
        the one ``retrying`` follows) and each attempt is ``request_once`` itself: while
        the model answers, a turn holds two coroutines of the loop, not one per layer."""
        if self.begun is None:  # else committed with the last result: the pipeline was quiet
            async with self.events.compactions():
                await self.pipeline_step(self.env.pipeline.before_call)
        policy = self.env.retry
        attempt = too_long_attempts = 0
        while True:
            attempt += 1
            try:
                response = await self._call_once(attempt, tool_choice, max_tokens)
                break
            except PromptTooLongError as error:
                too_long_attempts += 1
                react = partial(
                    self.env.pipeline.on_prompt_too_long, error=error, attempt=too_long_attempts
                )
                async with self.events.compactions():
                    outcome = await self.pipeline_step(react)
                if not outcome.applied:
                    raise
                attempt = 0  # the pipeline made the request smaller: count attempts again
                continue
            except ModelError as error:
                delay = policy.retry_delay(attempt, error)
                if delay is None:
                    raise
                self.events.retry_scheduled(error, delay, attempt)
            await anyio.sleep(delay)
        self.context.append(response.to_message())
        self.turns += 1
        self.last_usage = response.usage
        self.appended_since_usage.clear()  # the run's own list: no new one per call
        return response

    def begin_next_call_now(self) -> tuple[ModelRequest, CallRecord] | None:
        """The next turn's request and call row, if ``take_turn`` would build them with no
        await before committing the row: the pipeline has nothing to do before the call
        (``quiet_before_call``) and the prompt needs no rebuild. ``None``: it awaits."""
        quiet = self._quiet_call
        if quiet is None or not self.agent.context.system_prompt_snapshot:
            return None
        if not quiet(self.env.pipeline, self.context_view()):
            return None
        request = self.build_request()
        return request, self._call_row(request, 1)

    def _call_once(
        self, attempt: int, tool_choice: str | None, max_tokens: int | None
    ) -> Awaitable[ModelResponse]:
        """One attempt of a model turn: its request and call row, and the ``request_once``
        that commits the row, sends and commits the outcome (returned, not awaited here)."""
        begun, self.begun = self.begun, None
        if begun is not None and attempt == 1 and tool_choice is None and max_tokens is None:
            request, call, call_id = begun  # committed with the tool turn's last result
            return self.request_once(request, attempt=attempt, call=call, call_id=call_id)
        if not self.agent.context.system_prompt_snapshot:
            return self._call_rebuilt(attempt, tool_choice, max_tokens)
        request = self.build_request(tool_choice=tool_choice, max_tokens=max_tokens)
        return self.request_once(request, attempt=attempt, call=self._call_row(request, attempt))

    async def _call_rebuilt(
        self, attempt: int, tool_choice: str | None, max_tokens: int | None
    ) -> ModelResponse:
        """An attempt of an agent that keeps no prompt snapshot: the prompt built again
        (a new snapshot only if it changed), then the attempt."""
        await self.rebuild_snapshot("rebuild")
        request = self.build_request(tool_choice=tool_choice, max_tokens=max_tokens)
        call = self._call_row(request, attempt)
        return await self.request_once(request, attempt=attempt, call=call)

    def _call_row(self, request: ModelRequest, attempt: int) -> CallRecord:
        """The call row committed before ``request`` is sent (the write-ahead)."""
        return CallRecord(
            run_id=self.id,
            turn=self.turns + 1,
            attempt=attempt,
            fingerprint=request.fingerprint(),
            message_count=len(request.messages),
            created=time.time(),
            snapshot_version=self.snapshot_version,
            compactions=self.compactions,
            settings=request.settings.cache_key(),
        )

    async def request_once(
        self,
        request: ModelRequest,
        *,
        attempt: int,
        purpose: str | None = None,
        call: CallRecord | None = None,
        call_id: int | None = None,
    ) -> ModelResponse:
        """One model call attempt, traced as its own ``chat`` span (no retry).

        ``call``: the call row this attempt answers. It is committed before the request
        leaves (write-ahead; ``call_id``: it already is, under that id), its answer is
        committed inside the span (so what that records, the commit and a cache-break
        event, belongs to this call), and a failed attempt is committed as such after
        the span.
        """
        env = self.env
        if call is None:
            call_id = 0
        elif call_id is None:
            call_id = await env.store.begin_call(call, ())
        try:
            # the span held as two values, not a ``with`` (its object and bound ``__exit__``
            # would outlive the model's latency): ``open`` and ``close_span`` are its halves
            span, token = env.tracing.model_call(
                model=request.model,
                session_id=env.session_id,
                agent=self.agent.name,
                attempt=attempt,
                compacted=self.compactions > 0,
                messages=request.messages,
                system=request.system,
                purpose=purpose,
            ).open()
            try:
                if env.events.active:  # (no call per model call while nobody listens)
                    self.events.call_started(request, attempt, purpose)
                try:
                    model = env.model
                    if env.events.active and isinstance(model, StreamingModel):
                        response = await model.request_streaming(request, self.events.delta)
                    else:
                        response = await model.request(request)
                except ModelError as error:
                    env.tracing.model_error(span, error)
                    self.events.call_failed(attempt, purpose, error)
                    raise
                if env.events.active:
                    self.events.call_finished(attempt, purpose, response)
                await self.limits.charge(self, response.model or request.model, response.usage)
                message = response.to_message()
                env.tracing.model_response(
                    span,
                    response_id=response.id,
                    response_model=response.model,
                    stop_reason=response.stop_reason,
                    usage=response.usage,
                    output=message,
                )
                if call is not None:
                    await self._commit_response(call_id, call, request.model, response, message)
            except BaseException as leaving:  # what the ``with`` statement's exit did
                close_span(span, token, leaving)
                raise
            close_span(span, token, None)
            return response
        except ModelError as error:
            if call is not None:
                await env.store.finish_call(
                    call_id, status="error", error_type=type(error).__name__, error=str(error)
                )
            raise

    def with_retries(self, attempt: Callable[[int], Awaitable[T]]) -> Awaitable[T]:
        """``attempt(n)`` retried under the session's retry policy; each retry is traced
        and announced as an event. (The retry loop itself, not a coroutine around it.)"""
        return retrying(self.env.retry, attempt, on_retry=self.events.retry_scheduled)

    async def _commit_response(
        self,
        call_id: int,
        call: CallRecord,
        model: str,
        response: ModelResponse,
        message: Message,
    ) -> None:
        """Commit a call's answer (its assistant ``message``, usage, and the ``started``
        marks of the tools it asks for) in one transaction, inside the call's span."""
        uses = message.tool_uses
        started = self._started_events(uses)
        # an answer the loop takes as it is ends the run: its end commits with it
        ends = not uses and self.agent.output_type is None and self.stop is None
        ends = ends and "after_response" not in self.env.extras  # (a hook may still fail it)
        await self.env.store.finish_call(
            call_id,
            status="ok",
            message=MessageRecord(
                run_id=self.id,
                seq=self.next_seq,
                role="assistant",
                content=message_json(message),
                created=time.time(),
            ),
            response_id=response.id,
            model=response.model,
            stop_reason=response.stop_reason,
            usage=usage_json(response.usage),
            tool_events=started,
            run_output=message.text if ends else None,
        )
        self.ended_with_answer = ends
        self.next_seq += 1
        if self.own_usage is not None:
            self.own_usage.add(response.usage)
        self.last_response_id = response.id
        self.served_model = model
        self._fresh_tools = (message, uses, frozenset(map(_CALL_ID, started)))
        after = self.after_response(call_id, call, response)
        if after is not None:
            await after
