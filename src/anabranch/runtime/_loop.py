"""``AgentRun``: one agent's run, driven turn by turn under the write-ahead protocol.

The loop is a state machine over the committed context, so a fresh run and a resumed one
take the same path:

- last message is a user turn        -> (pipeline) -> commit call row -> call the model
                                        -> commit the assistant message + usage
- last message is an assistant turn with tool_use blocks
                                     -> run the tools that have no committed result
                                        (each result committed as it finishes)
                                        -> commit the user message with all results
- last message is a plain assistant turn -> the run is done

Nothing here is ever updated in place: every step appends.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import anyio
import pydantic
from anyio.abc import TaskGroup
from opentelemetry.trace import Span

from anabranch.agents import Agent
from anabranch.context._cache import system_digest, tools_digest
from anabranch.context._output import (
    describe_errors,
    output_retries_used,
    parse_output,
    retry_message,
)
from anabranch.errors import OutputValidationError
from anabranch.messages import (
    Message,
    ModelRequest,
    ModelResponse,
    SystemBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from anabranch.runtime._approval import GatedRun
from anabranch.runtime._cache_watch import CacheBreak, CacheWatch
from anabranch.runtime._context_view import ContextView
from anabranch.runtime._environment import Environment
from anabranch.runtime._final_report import final_report
from anabranch.runtime._history import (
    boundary_ranges,
    context_for,
    exchange_turns,
    load_messages,
    snapshot_blocks,
    snapshot_record,
    usage_anchor,
)
from anabranch.runtime._ids import new_id
from anabranch.runtime._memory import attach_relevant_memories
from anabranch.runtime._model_calls import ModelCalls
from anabranch.runtime._model_switch import served_model
from anabranch.runtime._pipeline import plain_twin
from anabranch.runtime._run_context import PipelineStep, RunContext
from anabranch.runtime._run_events import RunEvents
from anabranch.runtime._run_limits import LimitStop, session_limits
from anabranch.runtime._run_prompt import build_prompt, run_request, with_breakpoints
from anabranch.runtime._session_view import UsageTotals, trace_spend
from anabranch.runtime._thinking_view import floor_after_load, request_messages
from anabranch.runtime._tool_calls import INTERRUPTED_REPORT, ToolCalls
from anabranch.store import CallRecord, MessageRecord, RunRecord, SnapshotRecord, Store
from anabranch.traces import SpanRef, Tracing, close_span

T = TypeVar("T")

__all__ = ["INTERRUPTED_REPORT", "AgentRun", "Environment", "PipelineStep", "new_id"]

RESUME_LINKS = 8
"""How many earlier drives of a run its span links to (the most recent ones)."""


class AgentRun(ModelCalls, ToolCalls, RunContext):
    """One run of one agent with its own context. Create with ``start`` or ``load``."""

    def __init__(self, env: Environment, agent: Agent, record: RunRecord) -> None:
        self.env = env
        self.agent = agent
        self.record = record
        self.id = record.id
        """The run's id (its record's: a run keeps it for good; read on every step)."""
        self.limits = session_limits(env)
        """The session's limits and ledger (one object for the session's life)."""
        self.system: tuple[SystemBlock, ...] = ()
        self.tools: tuple[ToolDefinition, ...] = ()
        self.snapshot_version = 0
        self.context: list[Message] = []
        self.next_seq = 0
        self.turns = 0
        self.turn_base = 0
        """Turns done before this exchange of a conversation (``max_turns`` counts from here)."""
        self.last_usage: Usage | None = None
        self.own_usage: UsageTotals | None = None  # a run started here: its calls' usage
        self.last_response_id: str | None = None
        """The latest committed response's id (what cache diagnostics compare against)."""
        self.appended_since_usage: list[Message] = []
        self.compactions = 0
        self.thinking_floor = 0  # leading messages produced under an earlier prefix
        self.background: TaskGroup | None = None
        """Work started alongside the loop while it is driven (a summary ahead)."""
        self.served_model: str | None = None
        """The model that served the latest response (another model's, after a switch)."""
        self._fresh_tools: tuple[Message, list[ToolUseBlock], frozenset[str]] | None = None
        """The response just committed here, its tool calls, and those marked started with it."""
        pipeline = env.pipeline  # its plain twins (asked around every tool turn)
        self._ingest_now = plain_twin(pipeline, "ingest", "ingest_now")
        self._quiet_call = plain_twin(pipeline, "before_call", "quiet_before_call")
        self.committed_results: dict[str, ToolResultBlock] = {}
        """The latest tool calls' results as their finished events hold them (a message
        block equal to one is stored as a reference to its event)."""
        self.events = RunEvents(self, env.events)
        self.cache_watch = CacheWatch()
        self.stop: LimitStop | None = None
        """The limit that ended this run with a final report, if one did."""
        self._start_rows: tuple[RunRecord, SnapshotRecord, list[MessageRecord]] | None = None
        """A run started ``with_drive``: its start rows, committed by ``drive``."""

    # ------------------------------------------------------------------ creation
    @property
    def session_id(self) -> str:
        return self.env.session_id

    def as_view(self) -> GatedRun:
        return self

    def context_view(self) -> ContextView:
        return self

    @property
    def store(self) -> Store:
        return self.env.store

    @property
    def tracing(self) -> Tracing:
        return self.env.tracing

    @classmethod
    async def start(
        cls,
        env: Environment,
        agent: Agent,
        task: str | Sequence[Message],
        *,
        parent_run_id: str | None = None,
        parent_call_id: str | None = None,
        task_id: str | None = None,
        depth: int = 0,
        mode: str = "root",
        snapshot: tuple[tuple[SystemBlock, ...], tuple[ToolDefinition, ...]] | None = None,
        run_id: str | None = None,
        with_drive: bool = False,
    ) -> AgentRun:
        """Create and persist a new run: its record, prompt snapshot and first messages,
        in one transaction (a crash leaves all of it or none).

        ``with_drive``: for a caller that drives the run next with no await in between,
        the transaction is ``drive``'s first, together with the drive's span row (the
        resume link; one write instead of two, and the same crash windows: nothing that
        could stop the process runs between here and there)."""
        record = RunRecord(
            id=run_id or new_id("run"),
            session_id=env.session_id,
            agent_name=agent.name,
            model=agent.model,
            created=time.time(),
            parent_run_id=parent_run_id,
            parent_call_id=parent_call_id,
            task_id=task_id,
            depth=depth,
            mode=mode,
        )
        run = cls(env, agent, record)
        system, tools = snapshot if snapshot is not None else run.build_prompt()
        messages = [Message.user(task)] if isinstance(task, str) else list(task)
        messages = await attach_relevant_memories(env, agent, messages)
        run.snapshot_version = 1
        snapshot_row = snapshot_record(run.id, run.snapshot_version, system, tools, reason="start")
        if with_drive:
            run._start_rows = (record, snapshot_row, run.message_records(messages))
        else:
            await env.store.create_run(
                record, snapshot=snapshot_row, messages=run.message_records(messages)
            )
        run.system, run.tools = system, tools
        run.own_usage, run.undriven = UsageTotals(), True  # no call or drive of it elsewhere
        run.next_seq = len(messages)
        run.context = list(messages)
        run.appended_since_usage = list(messages)
        return run

    @classmethod
    async def load(
        cls,
        env: Environment,
        agent: Agent,
        record: RunRecord,
        *,
        missing: tuple[str, Sequence[Message]] | None = None,
        snapshot_if_missing: tuple[tuple[SystemBlock, ...], tuple[ToolDefinition, ...]]
        | None = None,
    ) -> AgentRun:
        """Rebuild a run from the store: latest snapshot, context after the last boundary.

        A crash may have left a run without its prompt snapshot or first messages (they
        are separate commits); ``missing`` = (reason, task messages) writes them as
        ``start`` would have (``snapshot_if_missing``: the snapshot it was given).
        """
        run = cls(env, agent, record)
        store = env.store
        snapshot = await store.latest_snapshot(record.id)
        if snapshot is None:
            given = snapshot_if_missing if missing is not None else None
            system, tools = given if given is not None else run.build_prompt()
            await run.save_snapshot(system, tools, reason=missing[0] if missing else "resume")
            if missing is not None:
                await run._offer_current_tools()
        else:
            run.system, run.tools = snapshot_blocks(snapshot)
            run.snapshot_version = snapshot.version
            await run._offer_current_tools()
        boundary = await store.latest_boundary(record.id)
        if boundary is None:
            records, run.context = await load_messages(store, record.id)
        else:
            run.compactions = await store.count_boundaries(record.id, "ok")
            run.context, records = await context_for(
                store, record.id, boundary.prefix, boundary_ranges(boundary)
            )
        run.thinking_floor = floor_after_load(run, records, boundary, snapshot)
        run.next_seq = await store.next_seq(record.id)
        # A call still in flight was cut off by a crash: close it; its request is rebuilt
        # byte for byte from the same snapshot and messages and sent again.
        await store.close_interrupted_calls(record.id)
        # only the latest calls matter here: read them from the end of the index
        last_ok = await store.last_call(record.id, ok=True)
        last_any = await store.last_call(record.id)
        calls = [c for c in (last_any, last_ok) if c is not None]
        # a run's successful calls are turns 1..n: the latest one's turn is their count
        run.turns = last_ok.turn if last_ok is not None else 0
        run.last_response_id = last_ok.response_id if last_ok is not None else None
        run.served_model = served_model(record, last_ok)
        exchange = exchange_turns(run.context)
        run.turn_base = run.turns - exchange if exchange is not None else 0
        run.appended_since_usage = list(run.context)
        anchor = usage_anchor(calls, records, run.context, boundary.created if boundary else None)
        if anchor is not None:
            run.last_usage, run.appended_since_usage = anchor
        if (
            boundary is not None
            and boundary.kind == "compaction"
            and snapshot is not None
            and snapshot.created < boundary.created
            and not any(c.created > boundary.created for c in calls)
        ):
            # Stopped between a compaction's boundary and its prompt rebuild (two commits):
            # finish the compaction as the live run would have, before its next call.
            await run.rebuild_snapshot("compaction")
        if missing is not None and not run.context:
            await run.append(*missing[1])
        return run

    # ------------------------------------------------------------------ prompt
    def build_prompt(self) -> tuple[tuple[SystemBlock, ...], tuple[ToolDefinition, ...]]:
        """Assemble the system blocks and tool list for this agent (deterministic)."""
        return build_prompt(self.agent, self.record, self.env.builtins)

    async def _offer_current_tools(self) -> None:
        """After the definition's tools changed (one removed, added or redescribed), offer
        what it has now: a new snapshot (reason ``definition_changed``; the system blocks
        stay byte for byte), so the tool list sent and the ``Unknown tool`` message agree,
        and the next call's lost cache is recorded as ``tools_changed``. A fork keeps its
        parent's tools."""
        if self.record.mode == "fork":
            return
        _, current = self.build_prompt()
        if tools_digest(current) != tools_digest(self.tools):
            await self.save_snapshot(self.system, current, reason="definition_changed")

    async def rebuild_snapshot(self, reason: str) -> bool:
        """Build the prompt again; store it as a new snapshot only if it changed."""
        system, tools = self.build_prompt()
        if system_digest(system) == system_digest(self.system) and tools_digest(
            tools
        ) == tools_digest(self.tools):
            return False
        await self.save_snapshot(system, tools, reason=reason)
        return True

    async def save_snapshot(
        self,
        system: tuple[SystemBlock, ...],
        tools: tuple[ToolDefinition, ...],
        *,
        reason: str,
    ) -> None:
        self.snapshot_version += 1
        record = snapshot_record(self.id, self.snapshot_version, system, tools, reason=reason)
        await self.env.store.save_snapshot(record)
        self.system, self.tools = system, tools
        self.thinking_floor = len(self.context)

    def build_request(
        self,
        *,
        tool_choice: str | None = None,
        max_tokens: int | None = None,
        context: Sequence[Message] | None = None,
    ) -> ModelRequest:
        """The exact request for the current context (or ``context``), cache breakpoints
        placed (<= 4)."""
        if context is None:
            floor = self.thinking_floor  # (none produced under an earlier prefix: as it is)
            context = self.context if floor <= 0 else request_messages(
                self.agent.model, self.context, floor
            )
        return run_request(
            self.agent,
            self.system,
            self.tools,
            context,
            last_response_id=self.last_response_id,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            placed=True,  # one request built, not one and then a copy with the marks
        )

    def with_breakpoints(self, request: ModelRequest) -> ModelRequest:
        """``request`` with cache breakpoints placed by this agent's policy.

        For any extra call that shares this run's prefix (e.g. a summarizer request built
        from the run's system, tools and leading messages), so it reads the run's cache.
        """
        return with_breakpoints(self.agent, request)

    # ------------------------------------------------------------------ driving
    async def drive(self) -> str:
        """Run until the agent gives a final answer; returns it.

        A limit (``max_turns``, ``timeout``, a budget) ends the run with a final report
        (``self.stop`` says which), or with ``on_limit="fail"`` raises (``MaxTurnsExceeded``,
        ``TimeoutError``, ``BudgetExceeded``; recorded as a failed run). Raises
        ``ModelError`` once retries are exhausted (the run stays unfinished and resumable).
        A run that already finished (e.g. loaded on resume) returns its committed answer.
        """
        if self.record.status in ("done", "incomplete"):
            return self.record.output or ""
        tracing = self.env.tracing
        task = self.context[0].text if self.context else ""
        # the span held as two values, not a ``with``: its object and the bound ``__exit__``
        # would live as long as the run (``open`` and ``close_span`` are its halves)
        span, token = tracing.agent_run(
            agent=self.agent.name,
            run_id=self.id,
            session_id=self.env.session_id,
            model=self.agent.model,
            task=task,
            resumed_from=await self._earlier_drives(),
        ).open()
        try:
            await self._record_drive(span)
            limits = self.limits
            self.events.run_started()
            try:
                # registered, and active while driven (a flag set and reset here: no
                # context manager object and bound ``__exit__`` for the run's life)
                state = await limits.enter(self)
                state.driving = True
                try:
                    if self.agent.on_limit == "fail" and self.agent.timeout is not None:
                        with anyio.fail_after(self.agent.timeout):
                            output = await self._driven()
                    elif (deadline := limits.hard_deadline(self.id)) == math.inf:
                        output = await self._driven()  # nothing to cut it off
                    else:
                        with anyio.CancelScope(deadline=deadline) as cap:
                            output = await self._driven()
                        if cap.cancelled_caught:
                            raise await limits.cut_off_run(self)
                finally:
                    state.driving = False
            except BaseException as error:
                self.events.run_failed(error)
                raise
            self.events.run_done(output, self.stop.reason if self.stop else None)
            tracing.agent_output(span, output)
            store = self.env.store
            await trace_spend(tracing, span, store, self.agent, self.record, self.own_usage)
        except BaseException as leaving:  # what the ``with`` statement's exit did
            close_span(span, token, leaving)
            raise
        close_span(span, token, None)
        return output

    async def _earlier_drives(self) -> list[SpanRef]:
        """The latest few drives of this run (each links further back): a run driven
        thousands of times (a long chat) would otherwise read and link every one."""
        if self.undriven:
            self.undriven = False
            return []
        spans = await self.env.store.run_spans(self.id, limit=RESUME_LINKS)
        self.undriven = False
        return [SpanRef(t, s) for t, s in spans]

    async def _record_drive(self, span: Span) -> None:
        """A run started ``with_drive``: its start rows, with the drive's span (the resume
        link); else the link alone. (A helper: what it reads is not kept while the run is
        driven.)"""
        ref = self.env.tracing.span_ref(span)
        link = (ref.trace_id, ref.span_id) if ref is not None else None
        store = self.env.store
        if self._start_rows is not None:
            record, snapshot_row, messages = self._start_rows
            first = self._first_call_now()
            call_id = await store.create_run(
                record,
                snapshot=snapshot_row,
                messages=messages,
                span=link,
                call=first[1] if first is not None else None,
            )
            if first is not None:
                self.begun = (*first, call_id)
            self._start_rows = None
        elif link is not None:  # so a resumed run's span can link back to this one
            await store.add_run_span(self.env.session_id, self.id, *link)

    def _first_call_now(self) -> tuple[ModelRequest, CallRecord] | None:
        """A new run's first request and call row, to commit with the run's start rows
        (one write instead of two), if the loop would build them with no await and its
        limit check cannot stop the run first (``only_turns_limit``): then nothing runs
        between that commit and the request that did not before. ``None``: the loop
        builds and commits the call itself, as usual."""
        if not self.limits.only_turns_limit(self) or not self.context:
            return None
        if self.context[-1].role != "user":
            return None
        try:
            return self.begin_next_call_now()
        except Exception:  # (a pipeline's check failing) met again in the usual order
            return None

    def _driven(self) -> Awaitable[str]:
        """The loop, with a task group for work ahead (``background``) only if the pipeline
        may start some for this agent (one without ``works_ahead`` always gets one)."""
        works_ahead = getattr(self.env.pipeline, "works_ahead", None)
        if works_ahead is not None and not works_ahead(self.agent):
            return self._loop()
        return self.alongside(self._loop)

    async def _loop(self) -> str:
        limits = self.limits
        limits_checked = False  # checked when the pending user turn was built
        while True:
            if not self.context:
                raise RuntimeError(f"run {self.id} has an empty context")
            last = self.context[-1]
            if last.role == "assistant":
                fresh = self._fresh_tools  # (``tool_uses`` builds a list per read)
                uses = fresh[1] if fresh is not None and fresh[0] is last else last.tool_uses
                del fresh  # (the response's record: not held while the next call waits)
                if uses:
                    notes = await self.run_tools(uses)  # and commits their turn
                    del uses  # (nor its list of calls)
                    if notes.stop is not None:
                        return await self._end_at_limit(notes.stop)
                    limits_checked = True
                    continue
                output = last.text
                if self.agent.output_type is not None:
                    checked = await self._checked_output(output)
                    if checked is None:
                        continue  # sent back with its validation errors
                    output = checked
                if not self.ended_with_answer:  # else committed with the answer's call
                    await self.env.store.finish_run(self.id, "done", output=output)
                return output
            if not limits_checked:
                stop = await limits.check(self)
                if stop is not None:
                    return await self._end_at_limit(stop)
            limits_checked = False
            await self.take_turn()

    async def _end_at_limit(self, stop: LimitStop) -> str:
        self.stop = stop
        return await final_report(self, stop, self.take_turn)

    async def _checked_output(self, text: str) -> str | None:
        """The answer as validated JSON; ``None`` after sending a failed one back.

        Raises ``OutputValidationError`` (the run fails) once the retries are used up.
        """
        output_type = self.agent.output_type
        assert output_type is not None
        try:
            return parse_output(text, output_type).model_dump_json()
        except pydantic.ValidationError as error:
            used = output_retries_used(self.context)
            allowed = self.agent.output_retries
            if used >= allowed:
                failure = OutputValidationError(self.agent.name, used + 1, describe_errors(error))
                await self.env.store.finish_run(self.id, "failed", error=str(failure))
                raise failure from None
            await self.append(retry_message(error, used + 1, allowed + 1))
            return None

    def after_response(
        self, call_id: int, call: CallRecord, response: ModelResponse
    ) -> Awaitable[None] | None:
        """Records a cache break if this call read less cache than it could; then runs the
        ``after_response`` hook of cooperating features, if any. What to await at once,
        or ``None`` when neither needs an await (the usual call: no coroutine for it)."""
        check = self.cache_watch.after_call(self, call_id, call, response)
        if check is not None:
            return self._after_check(check, call_id, response)
        extras = self.env.extras
        if "after_response" not in extras:
            return None
        hook: Callable[[AgentRun, int, ModelResponse], Awaitable[None]] = extras["after_response"]
        return hook(self, call_id, response)

    async def _after_check(
        self, check: Awaitable[CacheBreak | None], call_id: int, response: ModelResponse
    ) -> None:
        self.events.cache_break(await check)
        hook = self.env.extras.get("after_response")
        if hook is not None:
            await hook(self, call_id, response)
