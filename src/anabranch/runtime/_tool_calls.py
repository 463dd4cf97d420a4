"""``ToolCalls``: how the loop runs a response's tool calls (the tools half of ``AgentRun``).

A call runs at most once to completion: its ``started`` event is committed before it
runs (with the response, or just before), its ``finished`` event with the result as soon
as it returns; a resumed run reuses every finished result and, for a call cut off while
running, follows the tool's ``on_interrupt`` (run it again, or report the interruption).

The user turn that carries a turn's results is committed once every result is. When the
call that returns last finds every other result committed and the results message can be
built without an await (the pipeline's ``ingest_now``, the limits' ``next_turn_now``), its
``finished`` event, the turn's spills and that message go in one transaction, submitted
in the same step as its lone event would have been: so in the same batch, committed as
soon (docs/design-notes.md, "Store round trips per model call"). If the next model call
can be built without an await too (``begin_next_call_now``), its call row joins that
transaction (write-ahead: committed before that request is sent) and the loop sends it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Container, Coroutine, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

import anyio

from anabranch.agents import Agent, Tool
from anabranch.agents._tools import Pin
from anabranch.errors import ApprovalPendingError
from anabranch.messages import (
    Message,
    ModelRequest,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)
from anabranch.runtime._approval import ApprovalGate, GatedRun, gate_calls, needs_approval
from anabranch.runtime._built_blocks import result_block, user_message
from anabranch.runtime._builtins import BuiltinTool, ToolOutcome
from anabranch.runtime._context_view import ContextView, Ingested
from anabranch.runtime._environment import Environment
from anabranch.runtime._history import (
    attachments_from_json,
    attachments_json,
    pin_handle,
    pin_record,
)
from anabranch.runtime._run_events import RunEvents
from anabranch.runtime._run_limits import SessionLimits, TurnNotes
from anabranch.runtime._tool_exec import run_user_tool
from anabranch.store import (
    CallRecord,
    MessageRecord,
    RunRecord,
    SpillRecord,
    ToolEventRecord,
)
from anabranch.traces import close_span

__all__ = ["INTERRUPTED_REPORT", "ToolCalls"]

INTERRUPTED_REPORT = (
    "This tool call was interrupted (the process stopped while it ran) and was not run "
    "again; its effect is unknown. Check before repeating it."
)

NOTHING_FRESH: frozenset[str] = frozenset()
"""No call ids: ``fresh_calls`` outside a tool turn, a fresh turn's ``started`` (one object
for every run, not one per turn)."""

IngestNow = Callable[[object, ContextView, ToolUseBlock, ToolOutcome], Ingested]
"""A pipeline's ``ingest_now``, called with the pipeline first (``plain_twin``)."""
NextCall = tuple[ModelRequest, CallRecord]
"""The next model call's request and its call row, built before the row is committed."""


def _unfinished(uses: Sequence[ToolUseBlock], finished: Container[str]) -> list[ToolUseBlock]:
    """The calls of ``uses`` without a finished event. (Out of ``run_tools``: a
    comprehension there would make each name it reads a cell of every turn's coroutine.)"""
    return [use for use in uses if use.id not in finished]


def _not_held(todo: Sequence[ToolUseBlock], gate: ApprovalGate) -> list[ToolUseBlock]:
    """The calls of ``todo`` the approval gate neither denied nor holds."""
    return [use for use in todo if not gate.held(use)]


class _Turn:
    """One tool turn's calls while they run: their outcomes so far (each one's ``finished``
    event committed), and the notes of the user turn once it is committed."""

    __slots__ = (
        "closed",
        "committing",
        "gate",
        "marked",
        "nested",
        "outcomes",
        "settled",
        "shield",
        "started",
        "uses",
    )

    def __init__(
        self,
        uses: Sequence[ToolUseBlock],
        gate: ApprovalGate,
        outcomes: dict[str, ToolOutcome],
        started: AbstractSet[str],
        marked: frozenset[str],
        shield: bool,
    ) -> None:
        self.uses, self.gate, self.outcomes = uses, gate, outcomes
        self.started, self.marked = started, marked
        self.shield = shield
        """A time limit may cancel the calls: the last one's commit is shielded."""
        self.closed: TurnNotes | None = None
        """Set once the user turn is committed (with the last result)."""
        self.nested: tuple[ApprovalPendingError, ...] = ()
        """Sub-agents (run by this turn's calls) that stopped to wait for approval."""
        self.committing: set[str] = set()
        """Calls whose ``finished`` event is being committed alone (not in ``outcomes`` yet)."""
        self.settled: anyio.Event | None = None
        """Set once ``committing`` is empty again, for a call that waits to close the turn."""

    def commit_ended(self, call_id: str) -> None:
        """``call_id``'s lone commit has ended (committed or not): wake a call waiting for it."""
        self.committing.discard(call_id)
        if not self.committing and self.settled is not None:
            self.settled.set()
            self.settled = None

    def only_commits_pending(self, use: ToolUseBlock) -> bool:
        """Whether every call but ``use`` has its outcome, some still being committed: once
        those commits end, ``use`` can close the turn with its own result."""
        if not self.committing:
            return False
        for other in self.uses:
            if other is not use and other.id not in self.outcomes:
                if other.id not in self.committing:
                    return False
        return True


class ToolCalls:
    """Running tool calls for one agent run (mixed into ``AgentRun``, which sets these)."""

    env: Environment
    agent: Agent
    record: RunRecord
    id: str
    limits: SessionLimits
    tools: tuple[ToolDefinition, ...]
    events: RunEvents
    context: list[Message]
    next_seq: int
    appended_since_usage: list[Message]
    turns: int
    turn_base: int
    _fresh_tools: tuple[Message, list[ToolUseBlock], frozenset[str]] | None
    """The response just committed here (its message, as the context holds it), its tool
    calls (the very blocks, the list the loop runs) and those marked started with it."""
    committed_results: dict[str, ToolResultBlock]
    """The results of the latest calls as their finished events hold them."""
    _ingest_now: IngestNow | None
    """The pipeline's plain ``ingest`` (``plain_twin``), found once per run."""
    _scope_type: type[anyio.CancelScope] | None = None
    """The event loop's cancel scope class (found at the run's first tool call)."""
    fresh_calls: frozenset[str] = NOTHING_FRESH
    """The current turn's calls whose ``started`` events were committed here with the
    response that asked for them: none of them ran before (nothing they start exists)."""

    def as_view(self) -> GatedRun:
        """This run as the read-only view built-in tools (and the approval gate) receive."""
        raise NotImplementedError

    def context_view(self) -> ContextView:
        """This run as the read-only view the context pipeline receives."""
        raise NotImplementedError

    if TYPE_CHECKING:  # ``RunContext``'s (it comes after this class in ``AgentRun``)

        def message_records(
            self, messages: Sequence[Message], kind: str = "message"
        ) -> list[MessageRecord]: ...

        async def append(self, *messages: Message, kind: str = "message") -> None: ...

        def appended(self, message: Message) -> None: ...

        # ``ModelCalls``' (before this class in ``AgentRun``)
        begun: tuple[ModelRequest, CallRecord, int] | None

        def begin_next_call_now(self) -> NextCall | None: ...

    async def run_tools(self, uses: Sequence[ToolUseBlock]) -> TurnNotes:
        """Run every tool_use without a committed result, then commit the user turn with
        all results (and the limits' notes); those notes.

        Each result is committed as it finishes, so a finished tool is never run again.
        """
        fresh, self._fresh_tools = self._fresh_tools, None
        if fresh is not None and fresh[1] == uses:  # (the same blocks: compared by identity)
            # answered in this process a moment ago: nothing of it can have finished yet
            finished: dict[str, ToolEventRecord] = {}
            started: AbstractSet[str] = NOTHING_FRESH
            marked = fresh[2]
            events: list[ToolEventRecord] | None = None
            outcomes: dict[str, ToolOutcome] = {}
        else:
            events = await self.env.store.tool_events(self.id, [u.id for u in uses])
            finished = {e.call_id: e for e in events if e.event == "finished"}
            started = {e.call_id for e in events if e.event == "started"}
            marked = NOTHING_FRESH
            outcomes = {
                call_id: ToolOutcome(
                    e.content or "", e.is_error, attachments_from_json(e.attachments)
                )
                for call_id, e in finished.items()
            }
        self.fresh_calls = marked
        todo = _unfinished(uses, finished) if finished else uses
        gate = await gate_calls(self.as_view(), todo, events)
        if gate.denied or gate.waiting:
            outcomes.update(gate.denied)
            todo = _not_held(todo, gate)

        limits = self.limits
        deadline = limits.deadline(self.id)
        cut = deadline != math.inf and anyio.current_time() >= deadline  # past it: none runs
        turn = _Turn(uses, gate, outcomes, started, marked, shield=deadline != math.inf)
        if todo and not cut:
            calls = self._run_one(todo[0], turn) if len(todo) == 1 else self._run_calls(todo, turn)
            if deadline == math.inf:  # no time limit: no cancel scope to build per turn
                await calls
            else:
                with anyio.CancelScope(deadline=deadline) as scope:  # the limit cuts tools off
                    await calls
                cut = scope.cancelled_caught
        for use in todo if cut else ():
            if use.id not in outcomes and not gate.held(use):  # cut off by the time limit
                text = await limits.cut_off(self.env, self.id, self.agent, use)
                outcome = ToolOutcome(text, is_error=True)
                await self.env.store.record_tool_event(self._finished_event(use, outcome))
                outcomes[use.id] = outcome
        self.fresh_calls = NOTHING_FRESH  # every call ran: not kept across the next model call
        if turn.closed is not None:  # committed with the last result
            return turn.closed
        gate.raise_if_waiting(self.as_view(), turn.nested)
        # every outcome is a committed finished event's now (loaded, run, denied, cut off)
        self._hold_committed(uses, outcomes)
        results = []
        for use in uses:
            ingested = await self.env.pipeline.ingest(self.context_view(), use, outcomes[use.id])
            for spill in ingested.spills:
                await self.env.store.save_spill(spill.handle, self.id, spill.call_id, spill.content)
            results.append(self._entering(use, outcomes[use.id], ingested.outcome))
        notes = await limits.next_turn(self)
        message, records, next_call = self._user_turn(results, notes)
        store = self.env.store
        if next_call is None:
            await store.append_messages(records)
            self._turn_entered(message, None, 0)
        else:  # every result is committed: the message goes with the next call's row
            self._turn_entered(message, next_call, await store.begin_call(next_call[1], records))
        return notes

    def _user_turn(
        self, results: list[ToolResultBlock], notes: TurnNotes
    ) -> tuple[Message, list[MessageRecord], NextCall | None]:
        """The user turn of ``results`` and the limits' ``notes``, its store records, and
        the next call's request and row if they can be built now (``_next_call_after``):
        the one tail of both ways a turn is committed (after the tools, or with the last
        result)."""
        message = user_message((*results, *notes.blocks))
        next_call = self._next_call_after(message) if notes.stop is None else None
        return message, self.message_records([message]), next_call

    def _turn_entered(self, message: Message, next_call: NextCall | None, call_id: int) -> None:
        """The committed user turn joins the context (with the next call's row, committed
        with it under ``call_id``: the loop sends that call next)."""
        self.appended(message)
        if next_call is not None:
            self.begun = (*next_call, call_id)

    def _hold_committed(
        self, uses: Sequence[ToolUseBlock], outcomes: dict[str, ToolOutcome]
    ) -> None:
        """``committed_results``: each call's result as its committed ``finished`` event
        holds it (the run's own dict, filled again: not a new one per turn that outlives
        the next model call)."""
        committed = self.committed_results
        committed.clear()
        for use in uses:
            outcome = outcomes[use.id]
            committed[use.id] = result_block(
                use.id, outcome.content, outcome.is_error, outcome.attachments
            )

    def _entering(
        self, use: ToolUseBlock, committed: ToolOutcome, outcome: ToolOutcome
    ) -> ToolResultBlock:
        """The block for ``outcome``, the version of a result the pipeline let in."""
        if outcome is committed:  # enters the context as committed: the same block
            return self.committed_results[use.id]
        return result_block(use.id, outcome.content, outcome.is_error, outcome.attachments)

    async def _run_calls(self, todo: Sequence[ToolUseBlock], turn: _Turn) -> None:
        """Run several calls in parallel, each outcome into ``turn.outcomes``."""
        async with anyio.create_task_group() as group:
            for use in todo:
                group.start_soon(self._run_one, use, turn)

    async def _run_one(self, use: ToolUseBlock, turn: _Turn) -> None:
        """Run one call and commit its ``finished`` event (its pins first: a crash between
        them runs it again), with the user turn if it can close the turn (``_closing``;
        first waiting, when every other call has its outcome, for those still being
        committed alone: ``_settle``)."""
        try:
            if self.env.events.active:  # (no call per tool call while nobody listens)
                self.events.tool_started(use)
            tool = self.agent.tool(use.name)
            interrupted, marked = use.id in turn.started, use.id in turn.marked
            outcome = await self._run_tool(use, tool, interrupted=interrupted, marked=marked)
            pins = self._pins(use, tool, outcome)
            if pins:
                await self._commit_pins(use, pins)
            if turn.only_commits_pending(use) and self._may_close(turn):
                await self._settle(turn)
            closing = self._closing(use, outcome, turn)
            if closing is None:
                turn.committing.add(use.id)
                try:
                    await self.env.store.record_tool_event(self._finished_event(use, outcome))
                    turn.outcomes[use.id] = outcome
                finally:
                    turn.commit_ended(use.id)
            else:
                message, notes, commit, next_call = closing
                if turn.shield:  # a time limit cutting the calls off must not hide the commit
                    with anyio.CancelScope(shield=True):
                        call_id = await commit
                else:
                    call_id = await commit
                self._turn_entered(message, next_call, call_id)
                turn.closed = notes
                turn.outcomes[use.id] = outcome  # (a lone commit's is set before it ends)
            if self.env.events.active:
                self.events.tool_finished(use, outcome)
        except ApprovalPendingError as pending:  # a sub-agent waits: this run pauses too
            turn.nested = (*turn.nested, pending)  # and sibling calls finish

    def _closing(
        self, use: ToolUseBlock, outcome: ToolOutcome, turn: _Turn
    ) -> tuple[Message, TurnNotes, Coroutine[Any, Any, Any], NextCall | None] | None:
        """The write of ``use``'s ``finished`` event, the turn's spills and its user turn in
        one transaction (with that turn and its notes), if ``use`` is the turn's last
        result (every other one committed, nothing waits for approval) and the user turn
        can be built without an await: nothing runs between the tool's return and this
        commit that did not before (and the next call's row with them, if it can be
        built now: that call's request and row last). None: the event is committed alone."""
        ingest_now = self._ingest_now
        if ingest_now is None or not self._may_close(turn):
            return None
        for other in turn.uses:
            if other.id not in turn.outcomes and other is not use:
                return None
        try:
            return self._turn_commit(use, outcome, turn, ingest_now)
        except Exception:  # met again in the usual order, once the result is committed alone
            return None

    def _may_close(self, turn: _Turn) -> bool:
        """Whether a call's result may close ``turn`` (``_closing``), its others aside."""
        gate = turn.gate
        return not (
            self._ingest_now is None or self.limits.reads_ledger or gate.waiting or turn.nested
        )

    @staticmethod
    async def _settle(turn: _Turn) -> None:
        """Wait until the calls whose results are being committed alone are committed (or
        have failed), so that this call's result can close the turn: one commit for it,
        the user turn and the next call's row, instead of one for it alone and one for the
        rest. Shielded: a result whose tool has run is committed even if the turn is
        cancelled meanwhile, as when it is committed at once (the wait is for commits
        already on their way, each shielded itself)."""
        if turn.settled is None:
            turn.settled = anyio.Event()
        settled = turn.settled
        with anyio.CancelScope(shield=True):
            await settled.wait()

    def _turn_commit(
        self, use: ToolUseBlock, outcome: ToolOutcome, turn: _Turn, ingest_now: IngestNow
    ) -> tuple[Message, TurnNotes, Coroutine[Any, Any, Any], NextCall | None]:
        """The user turn that closes ``turn`` once ``use`` is committed, its notes,
        the write of both (not awaited; with the next call's row if it can be built now:
        then that call's request and row too), built in the order the usual path builds
        them."""
        outcomes = {**turn.outcomes, use.id: outcome}
        self._hold_committed(turn.uses, outcomes)
        results, spills, now = [], [], time.time()
        for each in turn.uses:
            ingested = ingest_now(self.env.pipeline, self.context_view(), each, outcomes[each.id])
            for s in ingested.spills:
                spills.append(SpillRecord(s.handle, self.id, s.call_id, s.content, now))
            results.append(self._entering(each, outcomes[each.id], ingested.outcome))
        notes = self.limits.next_turn_now(self)
        message, records, next_call = self._user_turn(results, notes)
        event = self._finished_event(use, outcome)
        store = self.env.store
        if next_call is not None:
            begin = store.begin_call(next_call[1], records, tool_event=event, spills=spills)
            return message, notes, begin, next_call
        commit = store.record_tool_event(event, spills=spills, messages=records)
        return message, notes, commit, None

    def _next_call_after(self, message: Message) -> NextCall | None:
        """The next call's request and row as ``take_turn`` would build them once
        ``message`` is committed, if it would with no await; the context stays as it was."""
        self.appended(message)
        try:
            return self.begin_next_call_now()
        except Exception:  # (a pipeline's check failing) met again in the usual order
            return None
        finally:
            self.next_seq -= 1
            self.context.pop()
            self.appended_since_usage.pop()

    def _started_events(self, uses: Sequence[ToolUseBlock]) -> list[ToolEventRecord]:
        """``started`` events for the calls that will run, committed with the response."""
        now = time.time()
        events = []
        for use in uses:
            tool = self.agent.tool(use.name)  # looked up once per call
            if (tool is not None or self._builtin(use.name) is not None) and not needs_approval(
                tool, use
            ):
                events.append(
                    ToolEventRecord(
                        run_id=self.id, call_id=use.id, name=use.name, event="started", created=now
                    )
                )
        return events

    def _finished_event(self, use: ToolUseBlock, outcome: ToolOutcome) -> ToolEventRecord:
        return ToolEventRecord(
            run_id=self.id,
            call_id=use.id,
            name=use.name,
            event="finished",
            created=time.time(),
            content=outcome.content,
            is_error=outcome.is_error,
            attachments=attachments_json(outcome.attachments),
        )

    @staticmethod
    def _pins(
        use: ToolUseBlock, tool: Tool | None, outcome: ToolOutcome
    ) -> Sequence[tuple[Pin, str]]:
        """What the call pinned, and for a ``pin=True`` tool its result, with their sources."""
        pinned = tool is not None and tool.pin
        if not outcome.pins and not pinned:
            return ()
        pins = [(pin, "pin") for pin in outcome.pins]
        if pinned and not outcome.is_error and outcome.content.strip():
            pins.append((Pin(text=outcome.content, label=f"{use.name} result"), "result"))
        return pins

    async def _commit_pins(self, use: ToolUseBlock, pins: Sequence[tuple[Pin, str]]) -> None:
        """Commit the call's ``pins``: each text as a spill (its recall handle), then a
        ``pin`` row naming it."""
        for index, (pin, source) in enumerate(pins):
            handle = pin_handle(self.id, use.id, index)
            await self.env.store.save_spill(handle, self.id, use.id, pin.text)
            record = pin_record(self.id, use.id, handle, pin, index, source=source)
            await self.env.store.add_boundary(record)

    def _builtin(self, name: str) -> BuiltinTool | None:
        return next(
            (b for b in self.env.builtins if b.name == name and b.applies_to(self.agent)), None
        )

    async def _run_tool(
        self, use: ToolUseBlock, tool: Tool | None, *, interrupted: bool, marked: bool = False
    ) -> ToolOutcome:
        """Run one call of ``tool`` (the agent's tool of that name; None: a built-in's or
        an unknown one; ``marked``: its ``started`` event is already committed)."""
        builtin = None if tool else self._builtin(use.name)
        store = self.env.store
        if tool is None and builtin is None:
            available = sorted(d.name for d in self.tools)
            outcome = ToolOutcome(
                f"Unknown tool {use.name!r}. Available tools: {', '.join(available) or 'none'}.",
                is_error=True,
            )
        elif interrupted and tool is not None and tool.on_interrupt == "report":
            outcome = ToolOutcome(INTERRUPTED_REPORT, is_error=True)
        else:
            if not marked:
                await store.record_tool_event(
                    ToolEventRecord(
                        run_id=self.id,
                        call_id=use.id,
                        name=use.name,
                        event="started",
                        created=time.time(),
                    )
                )
            # the span held as two values, not a ``with``: a tool that waits long (a
            # sub-agent's whole run) would keep its object and bound ``__exit__`` as long
            span, token = self.env.tracing.tool_call(
                tool=use.name,
                call_id=use.id,
                session_id=self.env.session_id,
                description=tool.description if tool else "",
                arguments=use.input,
            ).open()
            try:
                if tool is not None:
                    scope_type = self._scope_type
                    if scope_type is None:  # anyio finds the event loop's on every call
                        scope_type = self._scope_type = type(anyio.CancelScope())
                    outcome = await run_user_tool(
                        tool,
                        use,
                        session_id=self.env.session_id,
                        run_id=self.id,
                        agent_name=self.agent.name,
                        default_timeout=self.agent.tool_timeout,
                        cancel_scope=scope_type,
                    )
                else:
                    assert builtin is not None
                    outcome = await builtin.run(self.as_view(), use)
                self.env.tracing.tool_result(
                    span, outcome.content, outcome.is_error, outcome.attachments
                )
            except BaseException as leaving:  # what the ``with`` statement's exit did
                close_span(span, token, leaving)
                raise
            close_span(span, token, None)
        return outcome
