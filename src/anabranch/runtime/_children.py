"""Runs that report to someone else (sub-agents, graph tasks): start or continue them,
drive them to an outcome, and cap the report that flows back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from anabranch.agents import Agent
from anabranch.context._tokens import CHARS_PER_TOKEN
from anabranch.errors import ApprovalPendingError
from anabranch.messages import Message, SystemBlock, ToolDefinition
from anabranch.runtime._environment import Environment
from anabranch.runtime._loop import AgentRun
from anabranch.store import RunRecord, RunStatus, Store

__all__ = [
    "RunOutcome",
    "cap_report",
    "capped_report",
    "drive_to_outcome",
    "open_run",
    "report_handle",
    "settle_subtree",
]

Snapshot = tuple[tuple[SystemBlock, ...], tuple[ToolDefinition, ...]]


@dataclass(frozen=True)
class RunOutcome:
    """How a driven run ended (cancellation is not an outcome: it propagates)."""

    run_id: str
    status: Literal["done", "failed"]
    output: str = ""
    error: str | None = None


async def open_run(
    env: Environment,
    agent: Agent,
    existing: RunRecord | None,
    task: str | Sequence[Message],
    *,
    snapshot: Snapshot | None = None,
    parent_run_id: str | None = None,
    parent_call_id: str | None = None,
    task_id: str | None = None,
    depth: int = 0,
    mode: str = "root",
) -> AgentRun:
    """Start a new run, or continue the stored one (``existing``) exactly where it stopped.

    A crash may have left ``existing`` without its prompt snapshot or first messages
    (they are separate commits): the missing parts are written now, as ``start`` would have.
    """
    if existing is None:
        return await AgentRun.start(
            env,
            agent,
            task,
            parent_run_id=parent_run_id,
            parent_call_id=parent_call_id,
            task_id=task_id,
            depth=depth,
            mode=mode,
            snapshot=snapshot,
        )
    if await env.store.latest_snapshot(existing.id) is None:
        partial = AgentRun(env, agent, existing)
        system, tools = snapshot if snapshot is not None else partial.build_prompt()
        await partial.save_snapshot(system, tools, reason="start")
    run = await AgentRun.load(env, agent, existing)
    if not run.context:
        await run.append(*([Message.user(task)] if isinstance(task, str) else task))
    return run


def _describe(error: BaseException) -> str:
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return f"{type(error).__name__}: {error}"


async def settle_subtree(
    store: Store, session_id: str, run_id: str, status: RunStatus, error: str
) -> None:
    """Record ``status`` for ``run_id`` and every unfinished run below it."""
    runs = await store.list_runs(session_id)
    below: dict[str | None, list[RunRecord]] = {}
    for record in runs:
        below.setdefault(record.parent_run_id, []).append(record)
    by_id = {r.id: r for r in runs}
    pending = [by_id[run_id]] if run_id in by_id else []
    while pending:
        record = pending.pop()
        if record.status == "running":
            reason = error if record.id == run_id else f"stopped with run {run_id}: {error}"
            await store.finish_run(record.id, status, error=reason)
        pending.extend(below.get(record.id, []))


async def drive_to_outcome(run: AgentRun) -> RunOutcome:
    """Drive ``run`` to its end. Any failure (timeout, max turns, a model that keeps
    failing) is recorded on the run and returned; cancellation propagates untouched."""
    try:
        output = await run.drive()
    except ApprovalPendingError:  # paused, not failed: the run stays resumable as it is
        raise
    except TimeoutError as exc:
        timeout = run.agent.timeout
        error = f"timed out after {timeout} seconds" if timeout else _describe(exc)
    except Exception as exc:
        error = _describe(exc)
    else:
        return RunOutcome(run.id, "done", output)
    await settle_subtree(run.env.store, run.env.session_id, run.id, "failed", error)
    return RunOutcome(run.id, "failed", error=error)


def report_handle(run_id: str) -> str:
    """The recall handle of a run's full report."""
    return f"report_{run_id}"


def cap_report(report: str, cap_tokens: int, handle: str) -> tuple[str, bool]:
    """``report`` cut to about ``cap_tokens`` (4 characters a token) with a visible marker
    naming the recall handle of the full text; and whether it was cut."""
    limit = max(int(cap_tokens * CHARS_PER_TOKEN), 1)
    if len(report) <= limit:
        return report, False
    cut = report.rfind(" ", int(limit * 0.8), limit)
    head = report[: cut if cut > 0 else limit].rstrip()
    marker = (
        f"[report cut to {len(head)} of {len(report)} characters; full report: recall id={handle}]"
    )
    return f"{head}\n{marker}", True


async def capped_report(
    store: Store,
    report: str,
    cap_tokens: int,
    *,
    run_id: str,
    owner_run_id: str,
    call_id: str,
) -> str:
    """``cap_report``, saving the full report under its handle when it was cut."""
    handle = report_handle(run_id)
    text, cut = cap_report(report, cap_tokens, handle)
    if cut:
        await store.save_spill(handle, owner_run_id, call_id, report)
    return text
