"""How a run that cannot report ends: the runtime's own record of what it found (what
stands in for a report that could not be written) and the settling of its subtree."""

from __future__ import annotations

from anabranch.runtime._history import messages_for
from anabranch.store import RunRecord, RunStatus, Store

__all__ = ["FINDINGS_CHARS", "findings_record", "settle_subtree"]

FINDINGS_CHARS = 6_000
"""How much of a run's own record (last summary, final texts) stands in for its report."""


async def findings_record(store: Store, run_id: str, chars: int = FINDINGS_CHARS) -> str:
    """The runtime's own record of what a run found: its latest compaction summary and
    the texts it wrote since, newest kept when they do not all fit."""
    boundary = await store.latest_boundary(run_id)
    parts: list[str] = []
    if boundary is not None and boundary.summary:
        parts.append(f"Its latest summary:\n{boundary.summary.strip()}")
    since = boundary.created if boundary is not None else 0.0
    texts: list[str] = []
    records = [
        r
        for r in await store.load_messages(run_id)
        if r.role == "assistant" and r.kind == "message" and r.created >= since
    ]
    for message in await messages_for(store, records):
        if message.text.strip():
            texts.append(message.text.strip())
    budget = chars - sum(len(p) for p in parts)
    kept: list[str] = []
    for text in reversed(texts):
        if budget - len(text) < 0:
            if not kept:
                kept.append(text[-max(budget, 200) :])
            break
        kept.append(text)
        budget -= len(text)
    if kept:
        parts.append("What it wrote:\n" + "\n---\n".join(reversed(kept)))
    return "\n\n".join(parts)


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
