"""``ToolCalls``: how the loop runs a response's tool calls (the tools half of ``AgentRun``).

A call runs at most once to completion: its ``started`` event is committed before it
runs (with the response, or just before), its ``finished`` event with the result as soon
as it returns; a resumed run reuses every finished result and, for a call cut off while
running, follows the tool's ``on_interrupt`` (run it again, or report the interruption).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import anyio

from anabranch.agents import Agent
from anabranch.agents._tools import Pin
from anabranch.errors import ApprovalPendingError
from anabranch.messages import ToolDefinition, ToolResultBlock, ToolUseBlock
from anabranch.runtime._approval import ApprovalGate, GatedRun, gate_calls, needs_approval
from anabranch.runtime._builtins import BuiltinTool, ToolOutcome
from anabranch.runtime._context_view import ContextView
from anabranch.runtime._environment import Environment
from anabranch.runtime._history import (
    attachments_from_json,
    attachments_json,
    pin_handle,
    pin_record,
)
from anabranch.runtime._run_events import RunEvents
from anabranch.runtime._run_limits import session_limits
from anabranch.runtime._tool_exec import run_user_tool
from anabranch.store import ToolEventRecord

__all__ = ["INTERRUPTED_REPORT", "ToolCalls"]

INTERRUPTED_REPORT = (
    "This tool call was interrupted (the process stopped while it ran) and was not run "
    "again; its effect is unknown. Check before repeating it."
)


class ToolCalls:
    """Running tool calls for one agent run (mixed into ``AgentRun``, which sets these)."""

    env: Environment
    agent: Agent
    tools: tuple[ToolDefinition, ...]
    events: RunEvents
    _fresh_tools: tuple[tuple[str, ...], frozenset[str]] | None
    """Tool calls of the response just committed here, and those marked started with it."""
    committed_results: dict[str, ToolResultBlock]
    """The results of the latest calls as their finished events hold them."""

    @property
    def id(self) -> str:
        raise NotImplementedError

    def as_view(self) -> GatedRun:
        """This run as the read-only view built-in tools (and the approval gate) receive."""
        raise NotImplementedError

    def context_view(self) -> ContextView:
        """This run as the read-only view the context pipeline receives."""
        raise NotImplementedError

    async def run_tools(self, uses: Sequence[ToolUseBlock]) -> list[ToolResultBlock]:
        """Results for every tool_use, running only those without a committed result.

        Each result is committed as it finishes, so a finished tool is never run again.
        """
        fresh, self._fresh_tools = self._fresh_tools, None
        if fresh is not None and fresh[0] == tuple(u.id for u in uses):
            # answered in this process a moment ago: nothing of it can have finished yet
            finished: dict[str, ToolEventRecord] = {}
            started: set[str] = set()
            marked = fresh[1]
            events: list[ToolEventRecord] | None = None
        else:
            events = await self.env.store.tool_events(self.id, [u.id for u in uses])
            finished = {e.call_id: e for e in events if e.event == "finished"}
            started = {e.call_id for e in events if e.event == "started"}
            marked = frozenset()
        outcomes: dict[str, ToolOutcome] = {
            call_id: ToolOutcome(e.content or "", e.is_error, attachments_from_json(e.attachments))
            for call_id, e in finished.items()
        }
        todo = [use for use in uses if use.id not in finished]
        gate = await gate_calls(self.as_view(), todo, events)
        outcomes.update(gate.denied)
        todo = [use for use in todo if not gate.held(use)]

        limits = session_limits(self.env)
        deadline = limits.deadline(self.id)
        cut = anyio.current_time() >= deadline  # past it, nothing more runs
        if todo and not cut:
            calls = self._run_calls(todo, gate, outcomes, started, marked)
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
        gate.raise_if_waiting(self.as_view())
        # every outcome is a committed finished event's now (loaded, run, denied, cut off)
        self.committed_results = {
            use.id: ToolResultBlock(
                tool_use_id=use.id,
                content=outcomes[use.id].content,
                is_error=outcomes[use.id].is_error,
                attachments=outcomes[use.id].attachments,
            )
            for use in uses
        }
        results = []
        for use in uses:
            ingested = await self.env.pipeline.ingest(self.context_view(), use, outcomes[use.id])
            for spill in ingested.spills:
                await self.env.store.save_spill(spill.handle, self.id, spill.call_id, spill.content)
            outcome = ingested.outcome
            if outcome is outcomes[use.id]:  # enters the context as committed: the same block
                results.append(self.committed_results[use.id])
                continue
            results.append(
                ToolResultBlock(
                    tool_use_id=use.id,
                    content=outcome.content,
                    is_error=outcome.is_error,
                    attachments=outcome.attachments,
                )
            )
        return results

    async def _run_calls(
        self,
        todo: list[ToolUseBlock],
        gate: ApprovalGate,
        outcomes: dict[str, ToolOutcome],
        started: set[str],
        marked: frozenset[str],
    ) -> None:
        """Run ``todo`` (in parallel if several), each outcome into ``outcomes``."""
        if len(todo) == 1:
            use = todo[0]
            await self._run_one(use, gate, outcomes, use.id in started, use.id in marked)
            return
        async with anyio.create_task_group() as group:
            for use in todo:
                group.start_soon(
                    self._run_one, use, gate, outcomes, use.id in started, use.id in marked
                )

    async def _run_one(
        self,
        use: ToolUseBlock,
        gate: ApprovalGate,
        outcomes: dict[str, ToolOutcome],
        interrupted: bool,
        marked: bool,
    ) -> None:
        """Run one call and commit its ``finished`` event (its pins first: a crash between
        them runs it again)."""
        try:
            self.events.tool_started(use)
            outcome = await self._run_tool(use, interrupted=interrupted, marked=marked)
            await self._commit_pins(use, outcome)
            await self.env.store.record_tool_event(self._finished_event(use, outcome))
            outcomes[use.id] = outcome
            self.events.tool_finished(use, outcome)
        except ApprovalPendingError as pending:  # a sub-agent waits: this run pauses too
            gate.keep(pending)  # and sibling calls finish

    def _started_events(self, uses: Sequence[ToolUseBlock]) -> list[ToolEventRecord]:
        """``started`` events for the calls that will run, committed with the response."""
        now = time.time()
        return [
            ToolEventRecord(
                run_id=self.id, call_id=use.id, name=use.name, event="started", created=now
            )
            for use in uses
            if (self.agent.tool(use.name) is not None or self._builtin(use.name) is not None)
            and not needs_approval(self.agent.tool(use.name), use)
        ]

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

    async def _commit_pins(self, use: ToolUseBlock, outcome: ToolOutcome) -> None:
        """Commit what the call pinned (and, for a ``pin=True`` tool, its result): each
        text as a spill (its recall handle), then a ``pin`` row naming it."""
        tool = self.agent.tool(use.name)
        pins = [(pin, "pin") for pin in outcome.pins]
        if tool is not None and tool.pin and not outcome.is_error and outcome.content.strip():
            pins.append((Pin(text=outcome.content, label=f"{use.name} result"), "result"))
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
        self, use: ToolUseBlock, *, interrupted: bool, marked: bool = False
    ) -> ToolOutcome:
        """Run one call (``marked``: its ``started`` event is already committed)."""
        tool = self.agent.tool(use.name)
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
            with self.env.tracing.tool_call(
                tool=use.name,
                call_id=use.id,
                session_id=self.env.session_id,
                description=tool.description if tool else "",
                arguments=use.input,
            ) as span:
                if tool is not None:
                    outcome = await run_user_tool(
                        tool,
                        use,
                        session_id=self.env.session_id,
                        run_id=self.id,
                        agent_name=self.agent.name,
                        default_timeout=self.agent.tool_timeout,
                    )
                else:
                    assert builtin is not None
                    outcome = await builtin.run(self.as_view(), use)
                self.env.tracing.tool_result(
                    span, outcome.content, outcome.is_error, outcome.attachments
                )
        return outcome
