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
from anabranch.runtime._findings import findings_record, settle_subtree
from anabranch.runtime._loop import AgentRun
from anabranch.store import RunRecord, Store

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
    status: Literal["done", "incomplete", "failed"]
    output: str = ""
    """The report; for a failed run, the runtime's record of what it had found."""
    error: str | None = None
    stop: str | None = None
    """For an incomplete run: which limit stopped it (``LimitStop.describe()``)."""

    @classmethod
    def of_record(cls, record: RunRecord) -> RunOutcome:
        """The outcome of a run that finished earlier (read back from the store)."""
        if record.status == "incomplete":
            return cls(record.id, "incomplete", record.output or "", stop=record.error)
        if record.status == "done":
            return cls(record.id, "done", record.output or "")
        return cls(record.id, "failed", record.output or "", record.error)


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
    The caller drives the run next, with no await in between: a new run's rows are
    committed by ``drive``, with its span row (``AgentRun.start``'s ``with_drive``).
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
            with_drive=True,
        )
    first = [Message.user(task)] if isinstance(task, str) else list(task)
    return await AgentRun.load(
        env, agent, existing, missing=("start", first), snapshot_if_missing=snapshot
    )


def _describe(error: BaseException) -> str:
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return f"{type(error).__name__}: {error}"


async def drive_to_outcome(run: AgentRun) -> RunOutcome:
    """Drive ``run`` to its end. A limit's final report is an ``incomplete`` outcome; any
    failure (a model that keeps failing, a limit with ``on_limit="fail"``) is recorded on
    the run and returned with the runtime's record of what it had found; cancellation
    propagates untouched."""
    try:
        output = await run.drive()
    except ApprovalPendingError:  # paused, not failed: the run stays resumable as it is
        raise
    except TimeoutError as exc:
        timeout = run.agent.timeout
        plain = timeout and run.agent.on_limit == "fail"
        error = f"timed out after {timeout} seconds" if plain else _describe(exc)
    except Exception as exc:
        error = _describe(exc)
    else:
        if run.stop is not None:
            return RunOutcome(run.id, "incomplete", output, stop=run.stop.describe())
        if run.record.status == "incomplete":  # finished so before this drive
            return RunOutcome.of_record(run.record)
        return RunOutcome(run.id, "done", output)
    store = run.env.store
    findings = await findings_record(store, run.id)
    record = await store.get_run(run.id)
    if record is not None and record.status == "running":
        await store.finish_run(run.id, "failed", output=findings or None, error=error)
    await settle_subtree(store, run.env.session_id, run.id, "failed", error)
    stored = await store.get_run(run.id)
    return RunOutcome(run.id, "failed", (stored.output if stored else None) or "", error)


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
