"""The built-in ``spawn_agent`` tool: a parent delegates a task to a sub-agent that works
in its own context; only the sub-agent's (capped) final report comes back.

- ``fresh`` (default): the child gets its own system-prompt snapshot and the task as its
  first user message — nothing of the parent's history.
- ``fork``: the child starts from a byte-identical copy of the parent's context (same
  model, system and tools, so its first request reads the parent's prompt cache) plus one
  user turn that answers the parent's pending tool calls and carries the task.

Spawning is idempotent per ``tool_use`` id: if the process stopped while a child ran, the
parent's re-run of the same call finds the child in the store and continues it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from anabranch import events as ev
from anabranch._memo import IdentityMemo
from anabranch.agents import Agent
from anabranch.messages import (
    Message,
    TextBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)
from anabranch.runtime._builtins import ToolOutcome
from anabranch.runtime._children import RunOutcome, capped_report, drive_to_outcome, open_run
from anabranch.runtime._memory import inherit_memory
from anabranch.runtime._run_limits import parse_stop, session_limits
from anabranch.store import RunRecord

if TYPE_CHECKING:
    from anabranch.runtime._environment import Environment
from anabranch.runtime._loop import AgentRun
from anabranch.runtime._view import RunView

__all__ = ["SPAWN_TOOL_NAME", "SpawnLimits", "SpawnTool", "fork_definition"]

SPAWN_TOOL_NAME = "spawn_agent"
SpawnMode = Literal["fresh", "fork"]

_DESCRIPTION = (
    "Delegate a task to a sub-agent. It works in its own context and returns only its "
    "final report. Call this tool several times in one turn to run sub-agents in parallel. "
    "mode 'fresh' (default): the sub-agent sees only the task, so state everything it needs. "
    "mode 'fork': it starts from a copy of this whole conversation, then does the task."
)
_NOT_YOURS = "Not part of your task: the agent that forked you handles this call."


class SpawnLimits(BaseModel):
    """Limits on sub-agents, per runtime (``Runtime(spawn_limits=...)``).

    Per-child timeout, turn limit and report cap come from the child ``Agent``
    (``timeout``, ``max_turns``, ``max_report_tokens``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_depth: int = Field(3, ge=0)
    """Deepest allowed child (a root run has depth 0; 0 forbids spawning)."""
    max_children: int = Field(8, gt=0)
    """Children that may run at the same time in one session; more spawns are refused."""
    reports_share: float = Field(0.25, gt=0.0, le=1.0)
    """Fraction of the parent's window the reports of one turn may fill together: each of
    the turn's N spawns gets at most ``window * reports_share / N`` tokens."""


class SpawnArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: str
    task: str = Field(min_length=1)
    mode: SpawnMode = "fresh"


@dataclass
class _SessionSpawns:
    """Children running now in one session (shared by every run of the session)."""

    active: int = 0


def fork_definition(parent: Agent, role: Agent, report_tokens: int) -> Agent:
    """What a fork runs: the parent's model, instructions, tools and sub-agents (so its
    prompt is the parent's, byte for byte), under the role's name, window and limits."""
    return parent.model_copy(
        update={
            "name": role.name,
            "description": role.description,
            "context": role.context,
            "max_turns": role.max_turns,
            "timeout": role.timeout,
            "budget": role.budget,
            "on_limit": role.on_limit,
            "max_report_tokens": report_tokens,
        }
    )


def _fork_turn(
    run: AgentRun, call: ToolUseBlock, role: Agent, cap: int, args: SpawnArguments
) -> Message:
    """The user turn a fork starts with: a result for every tool call of the parent's
    last turn (this call's carries the task), then the fork's instructions."""
    turn = run.context[-1]
    results = tuple(
        ToolResultBlock(
            tool_use_id=use.id,
            content=f"Your task as the forked sub-agent:\n{args.task}"
            if use.id == call.id
            else _NOT_YOURS,
        )
        for use in turn.tool_uses
    )
    lines = [
        f"You are now a forked sub-agent ({role.name}). The conversation above is shared "
        f"context from the agent that forked you; do only the task in the result of "
        f"{SPAWN_TOOL_NAME} call {call.id} above.",
        f"Your final answer is your report to that agent. Keep it under {cap} tokens "
        f"(about {cap * 4} characters); longer reports are cut.",
    ]
    if role.instructions.strip():
        lines.append(f"Instructions for this role:\n{role.instructions.strip()}")
    return Message(role="user", content=(*results, TextBlock(text="\n\n".join(lines))))


class SpawnTool:
    """``spawn_agent``: offered to every agent that has ``subagents``."""

    name = SPAWN_TOOL_NAME
    clearable = False
    """A child's report is the dense result of its whole run: never cleared to make room."""

    def applies_to(self, agent: Agent) -> bool:
        return bool(agent.subagents)

    def definition(self, agent: Agent) -> ToolDefinition:
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {
                "agent": {
                    "type": "string",
                    "enum": [a.name for a in agent.subagents],
                    "description": "Which sub-agent does the task.",
                },
                "task": {
                    "type": "string",
                    "description": "The task, with everything the sub-agent needs to know.",
                },
                "mode": {
                    "type": "string",
                    "enum": ["fresh", "fork"],
                    "default": "fresh",
                    "description": "fresh: only the task; fork: a copy of this conversation.",
                },
            },
            "required": ["agent", "task"],
            "additionalProperties": False,
        }
        return ToolDefinition(name=self.name, description=_DESCRIPTION, input_schema=schema)

    async def run(self, view: RunView, call: ToolUseBlock) -> ToolOutcome:
        # Spawning starts runs, which only the loop's own runs can do: this built-in is part
        # of the engine, so it takes the engine's run behind the view.
        if not isinstance(view, AgentRun):
            raise TypeError(f"{self.name} runs inside the agent loop, not on {type(view)!r}")
        run = view
        try:
            args = SpawnArguments.model_validate(call.input)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(arguments)'}: {e['msg']}"
                for e in exc.errors()
            )
            return ToolOutcome(f"Invalid arguments for {self.name}: {problems}.", is_error=True)
        role = run.agent.subagent(args.agent)
        if role is None:
            allowed = ", ".join(a.name for a in run.agent.subagents)
            return ToolOutcome(
                f"Unknown sub-agent {args.agent!r}. You can spawn: {allowed}.", is_error=True
            )
        env = run.env
        cap = self._report_cap(run, role)
        fresh = call.id in run.fresh_calls  # asked for a moment ago: no child of it yet
        existing = None if fresh else await env.store.find_child_run(run.id, call.id)
        if existing is not None and existing.status != "running":
            stored = RunOutcome.of_record(existing)
            return await self._tool_result(run, call, role, stored, cap)
        state = env.extras.setdefault("spawn_children", _SessionSpawns())
        assert isinstance(state, _SessionSpawns)
        if existing is None:
            limits = session_limits(env)
            refusal = self._refusal(run, role, state) or await limits.spawn_refusal(run.id, role)
            if refusal is not None:
                return ToolOutcome(refusal, is_error=True)
        state.active += 1
        try:
            child = await self._open_child(run, call, role, args, existing, cap)
            run.events.emit(
                ev.ChildSpawned,
                child_run_id=child.id,
                child_agent=child.agent.name,
                call_id=call.id,
                mode=args.mode,
            )
            outcome = await drive_to_outcome(child)
        finally:
            state.active -= 1
        run.events.emit(
            ev.ChildReported,
            child_run_id=outcome.run_id,
            child_agent=role.name,
            call_id=call.id,
            status="failed" if outcome.status == "failed" else "done",
            chars=len(outcome.output),
            error=outcome.error,
            stop_reason=parse_stop(outcome.stop)[0],
        )
        return await self._tool_result(run, call, role, outcome, cap)

    def _refusal(self, run: AgentRun, role: Agent, state: _SessionSpawns) -> str | None:
        """Why a new child may not start now (depth, concurrent children), or None."""
        limits = self._limits(run.env)
        if run.record.depth + 1 > limits.max_depth:
            return (
                f"Cannot spawn {role.name}: this agent is at depth {run.record.depth} and "
                f"the maximum sub-agent depth is {limits.max_depth}. Do the task yourself."
            )
        if state.active >= limits.max_children:
            return (
                f"Cannot spawn {role.name}: {state.active} sub-agents are already running "
                f"in this session (max_children={limits.max_children}). Wait for their "
                f"reports, then spawn again or do the task yourself."
            )
        return None

    async def _open_child(
        self,
        run: AgentRun,
        call: ToolUseBlock,
        role: Agent,
        args: SpawnArguments,
        existing: RunRecord | None,
        cap: int,
    ) -> AgentRun:
        """Start the child (or continue the stored one) in its own context."""
        if args.mode == "fork":
            return await open_run(
                run.env,
                fork_definition(run.agent, role, cap),
                existing,
                [*run.context, _fork_turn(run, call, role, cap, args)],
                snapshot=(run.system, run.tools),
                parent_run_id=run.id,
                parent_call_id=call.id,
                depth=run.record.depth + 1,
                mode="fork",
            )
        return await open_run(
            run.env,
            _child_agent(run.agent, role, cap),
            existing,
            args.task,
            parent_run_id=run.id,
            parent_call_id=call.id,
            depth=run.record.depth + 1,
            mode="fresh",
        )

    @staticmethod
    def _limits(env: Environment) -> SpawnLimits:
        limits = env.extras.get("spawn_limits")
        return limits if isinstance(limits, SpawnLimits) else SpawnLimits()

    def _report_cap(self, run: AgentRun, role: Agent) -> int:
        """The child's report cap: its own, or less when the turn spawns many children."""
        siblings = sum(1 for u in run.context[-1].tool_uses if u.name == self.name) or 1
        share = int(run.agent.context.window * self._limits(run.env).reports_share) // siblings
        return max(1, min(role.max_report_tokens, share))

    async def _tool_result(
        self, run: AgentRun, call: ToolUseBlock, role: Agent, outcome: RunOutcome, cap: int
    ) -> ToolOutcome:
        """The parent's tool result: the capped report (an incomplete one says so and why),
        or the child's error with the runtime's record of what it had found."""
        report = await capped_report(
            run.env.store,
            outcome.output,
            cap,
            run_id=outcome.run_id,
            owner_run_id=run.id,
            call_id=call.id,
        )
        if outcome.status == "failed":
            found = f"\nWhat the runtime recorded of its findings:\n{report}" if report else ""
            return ToolOutcome(
                f"Sub-agent {role.name} (run {outcome.run_id}) failed: "
                f"{outcome.error or 'unknown error'}{found}",
                is_error=True,
            )
        if outcome.status == "incomplete":
            _, why = parse_stop(outcome.stop)
            header = (
                f"[incomplete report of sub-agent {role.name}, run {outcome.run_id}: "
                f"{why or 'stopped by a limit'}; it did not finish its task]"
            )
            return ToolOutcome(f"{header}\n{report}")
        return ToolOutcome(f"[report of sub-agent {role.name}, run {outcome.run_id}]\n{report}")


_CHILD_AGENTS: IdentityMemo[dict[int, Agent]] = IdentityMemo(limit=256)


def _child_agent(parent: Agent, role: Agent, cap: int) -> Agent:
    """The agent a fresh child of ``role`` runs as: the parent's memory inherited, the
    report cap set. One object per parent, role and cap (all frozen), so the children of
    one role share their built prompt (``build_prompt``) instead of each building it."""
    derived = _CHILD_AGENTS.get(((parent, role),), _no_agents)
    agent = derived.get(cap)
    if agent is None:
        agent = inherit_memory(parent, role).model_copy(update={"max_report_tokens": cap})
        derived[cap] = agent
    return agent


def _no_agents(*_groups: object) -> dict[int, Agent]:
    return {}
