"""An agent session's root run driven under the session driver, and its result."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from anabranch.agents import Agent
from anabranch.runtime._loop import AgentRun
from anabranch.runtime._results import RunResult, SessionStatus, build_result
from anabranch.runtime._run_limits import parse_stop
from anabranch.runtime._session import SessionDriver, SessionEnd
from anabranch.store import RunRecord, Store

__all__ = ["ENDED", "agent_result", "drive_agent", "ended_root", "root_end", "root_run"]

ENDED = ("done", "incomplete", "failed")
"""A root run's statuses once it has ended."""


async def root_run(store: Store, session_id: str) -> RunRecord | None:
    """The session's root run (``None`` before its first commit)."""
    runs = await store.list_runs(session_id)
    return next((r for r in runs if r.parent_run_id is None and r.task_id is None), None)


def root_end(root: RunRecord) -> SessionEnd:
    """The session's end, from its ended root run."""
    status: SessionStatus = "done"
    if root.status == "incomplete" or root.status == "failed":
        status = root.status
    return SessionEnd(status, output=root.output or "", error=root.error)


def ended_root(
    store: Store, session_id: str, *, continuing: bool
) -> Callable[[], Awaitable[SessionEnd | None]]:
    """The session's end if its root run has ended, read when called (under the lease, so a
    run another process finished since the caller's read is seen). ``continuing``: an
    ``incomplete`` root is being continued under a new budget, so it has not ended."""

    async def ended() -> SessionEnd | None:
        root = await root_run(store, session_id)
        if root is None or root.status not in ENDED:
            return None
        if continuing and root.status == "incomplete":
            return None
        return root_end(root)

    return ended


async def agent_result(
    store: Store,
    agents: Mapping[str, Agent],
    session_id: str,
    run_id: str,
    agent_name: str,
    end: SessionEnd,
) -> RunResult:
    """The result of an agent session that ended as ``end`` (its output validated against
    the agent's ``output_type`` when the agent is known)."""
    return await build_result(
        store,
        session_id,
        run_id=run_id,
        agent=agent_name,
        status=end.status,
        output=end.output,
        error=end.error,
        cause=end.cause,
        output_type=agent.output_type if (agent := agents.get(agent_name)) else None,
        stop_reason=parse_stop(end.error)[0] if end.status == "incomplete" else None,
    )


async def drive_agent(
    driver: SessionDriver,
    store: Store,
    agents: Mapping[str, Agent],
    session_id: str,
    agent_name: str,
    open_run: Callable[[], Awaitable[AgentRun]],
    *,
    task: str,
    resumed: bool = False,
    ended: Callable[[], Awaitable[SessionEnd | None]] | None = None,
    taken: bool = False,
) -> RunResult:
    """Drive an agent session's root run under the session driver (``ended``, ``taken``:
    see ``SessionDriver.drive``)."""
    drive = _RootDrive(store, agents, session_id, agent_name, open_run)
    return await driver.drive(
        session_id,
        drive.body,
        result=drive.result,
        task=task,
        resumed=resumed,
        ended=ended,
        taken=taken,
    )


class _RootDrive:
    """One drive of an agent session's root run: its body and its result (one object for
    the session's length, not two closures and their cells)."""

    __slots__ = ("agent_name", "agents", "open_run", "run_id", "session_id", "store")

    def __init__(
        self,
        store: Store,
        agents: Mapping[str, Agent],
        session_id: str,
        agent_name: str,
        open_run: Callable[[], Awaitable[AgentRun]],
    ) -> None:
        self.store = store
        self.agents = agents
        self.session_id = session_id
        self.agent_name = agent_name
        self.open_run = open_run
        self.run_id = ""

    async def body(self) -> SessionEnd:
        run = await self.open_run()
        self.run_id = run.id
        output = await run.drive()
        if run.stop is not None:
            return SessionEnd("incomplete", output=output, error=run.stop.describe())
        if run.record.status == "incomplete":  # it had ended so before this drive
            return SessionEnd("incomplete", output=output, error=run.record.error)
        return SessionEnd("done", output=output)

    async def result(self, end: SessionEnd) -> RunResult:
        store, session_id, run_id = self.store, self.session_id, self.run_id
        if not run_id:  # the root run could not even be opened
            root = await root_run(store, session_id)
            run_id = root.id if root else ""
        return await agent_result(store, self.agents, session_id, run_id, self.agent_name, end)
