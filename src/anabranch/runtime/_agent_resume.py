"""Resuming an agent session (``Runtime.resume``): from wherever its root run stopped, or
its result when it had ended."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from anabranch.agents import Agent, Budget
from anabranch.runtime._agent_session import (
    ENDED,
    agent_result,
    drive_agent,
    ended_root,
    root_end,
    root_run,
)
from anabranch.runtime._budgets import refuse_continue
from anabranch.runtime._environment import Environment
from anabranch.runtime._loop import AgentRun
from anabranch.runtime._results import RunResult
from anabranch.runtime._run_limits import continue_notice
from anabranch.runtime._session import SessionDriver
from anabranch.store import SessionRecord, Store

__all__ = ["resume_agent"]


async def resume_agent(
    driver: SessionDriver,
    store: Store,
    agents: Mapping[str, Agent],
    session: SessionRecord,
    *,
    resolve: Callable[[], Agent],
    environment: Callable[[], Awaitable[Environment]],
    budget: Budget | None,
) -> RunResult:
    """Continue the agent session ``session`` (``resolve``: its root agent; ``environment``:
    its environment under its budgets; ``budget``: a new one, which lets a session a limit
    stopped continue)."""
    session_id = session.id
    root = await root_run(store, session_id)
    stopped = root if root is not None and root.status == "incomplete" and budget else None
    if root is not None and root.status in ENDED and stopped is None:
        # Nothing left to run (the process may have stopped before the session's
        # status was committed: record it now).
        end = root_end(root)
        if session.status != end.status:  # read without the lease: checked again under it
            await driver.settle(session_id, end)
        return await agent_result(store, agents, session_id, root.id, root.agent_name, end)
    root_agent = resolve()
    env = await environment()
    if stopped is not None:
        await refuse_continue(env.extras["limits"], session_id)

    async def load() -> AgentRun:
        # read again under the lease: another process may have driven the session
        # between the read above and taking the lease (then it is loaded as it ended)
        current = await root_run(store, session_id)
        if current is None:  # crashed before the first message was committed
            return await AgentRun.start(env, root_agent, session.task, with_drive=True)
        run = await AgentRun.load(env, root_agent, current)
        if stopped is not None:  # a limit stopped it: continue under the new budget
            await run.continue_with(continue_notice(stopped, budget))
        return run

    return await drive_agent(
        driver,
        store,
        agents,
        session_id,
        root_agent.name,
        load,
        task=session.task,
        resumed=True,
        ended=ended_root(store, session_id, continuing=stopped is not None),
    )
