"""Human approval of tool calls (``@tool(needs_approval=...)``), durable across processes.

Before a run executes the calls of a turn, every call that needs approval and has no
decision is committed as an ``approval_requested`` tool event; the turn's other calls
run, then the run stops with ``ApprovalPendingError`` (the session waits, resumable). An
``approval_decided`` event answers it (``Runtime.approve`` / ``anabranch approve``); on
resume an approved call runs, and a denied one reaches the model as an ``is_error``
result carrying the reason.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Protocol

from opentelemetry import trace

from anabranch import events as ev
from anabranch.agents import Tool
from anabranch.errors import ApprovalPendingError, UserError
from anabranch.messages import ToolUseBlock
from anabranch.runtime._builtins import ToolOutcome
from anabranch.runtime._history import tool_event_payload
from anabranch.runtime._run_events import RunEvents
from anabranch.runtime._view import RunView
from anabranch.store import Store, ToolEventRecord


class GatedRun(RunView, Protocol):
    """What the approval gate reads of a run: its view and its event side."""

    @property
    def events(self) -> RunEvents: ...


__all__ = [
    "APPROVAL_DECIDED",
    "APPROVAL_REQUESTED",
    "NO_APPROVALS",
    "ApprovalGate",
    "PendingApproval",
    "decide",
    "gate_calls",
    "needs_approval",
    "pending_approvals",
]

APPROVAL_REQUESTED: Final = "approval_requested"
APPROVAL_DECIDED: Final = "approval_decided"


def needs_approval(tool: Tool | None, use: ToolUseBlock) -> bool:
    """Whether ``use`` must wait for a person (a failing predicate counts as yes)."""
    if tool is None or not tool.needs_approval:
        return False
    if tool.needs_approval is True:
        return True
    try:
        return bool(tool.needs_approval(dict(use.input)))
    except Exception:
        return True


def denial_text(reason: str) -> str:
    return f"The user denied this tool call; it was not run. Reason: {reason or 'none given'}"


_NONE_DENIED: Mapping[str, ToolOutcome] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ApprovalGate:
    """What the approvals say about one turn's calls (``NO_APPROVALS`` when none needs one)."""

    denied: Mapping[str, ToolOutcome] = field(default_factory=lambda: _NONE_DENIED)
    waiting: Sequence[ToolUseBlock] = ()

    def held(self, use: ToolUseBlock) -> bool:
        return use.id in self.denied or any(w.id == use.id for w in self.waiting)

    def raise_if_waiting(
        self, run: GatedRun, nested: Sequence[ApprovalPendingError] = ()
    ) -> None:
        """After the turn's other calls finished: stop the run if anything waits, here or
        in ``nested`` (sub-agents the turn's calls ran that stopped to wait)."""
        calls = [(run.id, use.id, use.name) for use in self.waiting]
        for pending in nested:
            calls.extend(pending.calls)
        if calls:
            error = ApprovalPendingError(calls)
            error.session_id = run.session_id
            raise error


NO_APPROVALS: Final = ApprovalGate()
"""The gate of a turn none of whose calls needs approval (shared: a gate never changes)."""


async def gate_calls(
    run: GatedRun, todo: Sequence[ToolUseBlock], known: Sequence[ToolEventRecord] | None
) -> ApprovalGate:
    """Decide, request or keep waiting for the calls of ``todo`` that need approval.

    ``known``: the calls' committed tool events (None: the turn was just answered here,
    so none can exist yet).
    """
    agent = run.agent
    if not agent.asks_approval():  # (no tool of it can: no look-up per call)
        return NO_APPROVALS
    asking = [use for use in todo if needs_approval(agent.tool(use.name), use)]
    if not asking:
        return NO_APPROVALS
    denied: dict[str, ToolOutcome] = {}
    waiting: list[ToolUseBlock] = []
    events = list(known) if known is not None else []
    requested = {e.call_id for e in events if e.event == APPROVAL_REQUESTED}
    decided = {e.call_id: e for e in events if e.event == APPROVAL_DECIDED}
    for use in asking:
        decision = decided.get(use.id)
        if decision is not None:
            answer = tool_event_payload(decision)
            if not answer.get("approved"):
                outcome = ToolOutcome(denial_text(answer.get("reason", "")), True)
                await run.store.record_tool_event(
                    ToolEventRecord(
                        run_id=run.id,
                        call_id=use.id,
                        name=use.name,
                        event="finished",
                        created=time.time(),
                        content=outcome.content,
                        is_error=True,
                    )
                )
                denied[use.id] = outcome
            continue
        waiting.append(use)
        if use.id in requested:
            continue
        await run.store.record_tool_event(
            ToolEventRecord(
                run_id=run.id,
                call_id=use.id,
                name=use.name,
                event=APPROVAL_REQUESTED,
                created=time.time(),
                content=json.dumps(use.input, sort_keys=True),
            )
        )
        run.events.emit(ev.ApprovalRequested, call_id=use.id, tool=use.name, arguments=use.input)
        run.tracing.event(
            trace.get_current_span(),
            "anabranch.approval_requested",
            {"gen_ai.tool.call.id": use.id, "gen_ai.tool.name": use.name},
        )
    return ApprovalGate(denied, waiting)


@dataclass(frozen=True)
class PendingApproval:
    """A tool call waiting for a decision."""

    run_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    requested: float


async def pending_approvals(store: Store, session_id: str) -> list[PendingApproval]:
    """Every undecided approval request of the session, oldest first."""
    events = await store.session_tool_events(session_id, (APPROVAL_REQUESTED, APPROVAL_DECIDED))
    decided = {(e.run_id, e.call_id) for e in events if e.event == APPROVAL_DECIDED}
    return [
        PendingApproval(e.run_id, e.call_id, e.name, tool_event_payload(e), e.created)
        for e in events
        if e.event == APPROVAL_REQUESTED and (e.run_id, e.call_id) not in decided
    ]


async def decide(
    store: Store, session_id: str, call_id: str, *, approved: bool, reason: str = ""
) -> PendingApproval:
    """Commit the decision on ``call_id``'s pending approval.

    Raises:
        UserError: no pending approval with that call id in the session.
    """
    for item in await pending_approvals(store, session_id):
        if item.call_id == call_id:
            await store.record_tool_event(
                ToolEventRecord(
                    run_id=item.run_id,
                    call_id=call_id,
                    name=item.tool,
                    event=APPROVAL_DECIDED,
                    created=time.time(),
                    content=json.dumps({"approved": approved, "reason": reason}),
                    is_error=not approved,
                )
            )
            return item
    raise UserError(f"no tool call {call_id!r} is waiting for approval in session {session_id}")
