"""Read-only views of sessions for the CLI and users: lists and run trees."""

from __future__ import annotations

from dataclasses import dataclass, field

from anabranch.context.messages import Usage
from anabranch.store import CallRecord, RunRecord, SessionRecord, SQLiteStore

__all__ = ["RunNode", "SessionSummary", "list_sessions", "session_tree"]


@dataclass
class RunNode:
    """One agent run in a session's tree, with its own accounting."""

    run: RunRecord
    turns: int = 0
    usage: Usage = field(default_factory=Usage)
    failed_attempts: int = 0
    compactions: int = 0
    children: list[RunNode] = field(default_factory=list)


@dataclass
class SessionSummary:
    session: SessionRecord
    status: str
    """``done``/``failed``/``running`` (a live process has it) or ``interrupted``."""
    agents: int
    usage: Usage


def _usage(calls: list[CallRecord]) -> Usage:
    total = Usage()
    for call in calls:
        if call.status == "ok" and call.usage:
            total = total + Usage.model_validate_json(call.usage)
    return total


async def _status(store: SQLiteStore, session: SessionRecord) -> str:
    if session.status in ("done", "failed") and session.finished is not None:
        runs = await store.list_runs(session.id)
        roots = [r for r in runs if r.parent_run_id is None]
        if roots and all(r.status in ("done", "failed") for r in roots):
            return session.status
    if await store.lease_holder(session.id):
        return "running"
    return "interrupted"


async def list_sessions(store: SQLiteStore, limit: int = 50) -> list[SessionSummary]:
    """Newest sessions first, with status, agent-run count and total usage."""
    summaries = []
    for session in await store.list_sessions(limit):
        runs = await store.list_runs(session.id)
        calls = await store.session_calls(session.id)
        summaries.append(
            SessionSummary(
                session=session,
                status=await _status(store, session),
                agents=len(runs),
                usage=_usage(calls),
            )
        )
    return summaries


async def session_tree(store: SQLiteStore, session_id: str) -> list[RunNode]:
    """The session's runs as a forest (roots first, children under their parents)."""
    runs = await store.list_runs(session_id)
    calls = await store.session_calls(session_id)
    boundaries = await store.list_boundaries(session_id=session_id)
    nodes = {r.id: RunNode(run=r) for r in runs}
    for call in calls:
        node = nodes.get(call.run_id)
        if node is None:
            continue
        if call.status == "ok":
            node.turns += 1
            if call.usage:
                node.usage = node.usage + Usage.model_validate_json(call.usage)
        elif call.status == "error":
            node.failed_attempts += 1
    for boundary in boundaries:
        if boundary.run_id in nodes and boundary.kind == "compaction" and boundary.status == "ok":
            nodes[boundary.run_id].compactions += 1
    roots: list[RunNode] = []
    for run in runs:
        node = nodes[run.id]
        parent = nodes.get(run.parent_run_id) if run.parent_run_id else None
        (parent.children if parent else roots).append(node)
    return roots
