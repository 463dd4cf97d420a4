"""A resume decides what to drive from what it read *before* it took the session's lease.
Another process can finish the session in between (a DBOS-recovered copy of a session a
live worker was finishing, under load): the resume must then load the session as it
ended, never drive the stale copy it read, call the model or start a second root run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from anabranch import Agent, Graph, GraphResult, Runtime, Task, tool
from anabranch.errors import ModelConnectionError, StoreError
from anabranch.messages import ModelRequest, ToolUseBlock
from anabranch.models._retry import RetryPolicy
from anabranch.runtime import RunResult
from anabranch.store import PostgresStore, RunStatus, SQLiteStore
from anabranch.testing import FunctionModel
from tests.databases import is_postgres, rows

pytestmark = pytest.mark.anyio

ONCE = RetryPolicy(max_attempts=1, base_delay=0.0, max_delay=0.0)


Gate = tuple[anyio.Event, anyio.Event]


async def _through(gate: Gate | None) -> None:
    if gate is not None:
        waiting, go = gate
        waiting.set()
        await go.wait()


class GatedStore(SQLiteStore):
    """A real SQLite store whose next lease acquisition first sets ``waiting`` and waits
    for ``go``: the gap between a resume's reads and its lease, held open."""

    gate: Gate | None = None

    async def acquire_lease(
        self, session_id: str, owner: str, ttl: float, *, running: bool = False
    ) -> None:
        gate, self.gate = self.gate, None
        await _through(gate)
        await super().acquire_lease(session_id, owner, ttl, running=running)


class GatedPostgresStore(PostgresStore):
    """``GatedStore`` on a real PostgreSQL."""

    gate: Gate | None = None

    async def acquire_lease(
        self, session_id: str, owner: str, ttl: float, *, running: bool = False
    ) -> None:
        gate, self.gate = self.gate, None
        await _through(gate)
        await super().acquire_lease(session_id, owner, ttl, running=running)


def _network_down(request: ModelRequest) -> str:
    raise ModelConnectionError("network down")


def _refuse(request: ModelRequest) -> str:
    raise AssertionError("the session was finished: the model must not be called")


def _answer(request: ModelRequest) -> str:
    return "the answer"


async def test_a_session_finished_while_a_resume_waited_for_its_lease_is_not_driven_again(
    tmp_path: Path,
) -> None:
    db = tmp_path / "race.db"
    agent = Agent(name="worker", instructions="Answer.")
    async with Runtime(db=db, model=FunctionModel(_network_down), retry=ONCE) as rt:
        first = await rt.run(agent, "go")
    assert first.status == "failed"  # unfinished and resumable: its root run is open

    waiting, go = anyio.Event(), anyio.Event()
    late: list[RunResult] = []
    opened = await GatedStore.open(db)
    assert isinstance(opened, GatedStore)
    opened.gate = (waiting, go)
    async with opened as gated:
        async with (
            Runtime(store=gated, model=FunctionModel(_refuse), agents=[agent]) as stale,
            Runtime(db=db, model=FunctionModel(_answer), agents=[agent]) as live,
        ):
            with anyio.fail_after(60):
                async with anyio.create_task_group() as group:

                    async def resume_late() -> None:
                        late.append(await stale.resume(first.session_id))

                    group.start_soon(resume_late)
                    await waiting.wait()  # it has read the session, not yet leased it
                    finished = await live.resume(first.session_id)
                    go.set()
            runs = await live.store.list_runs(first.session_id)
            session = await live.store.get_session(first.session_id)
    assert finished.status == "done" and finished.output == "the answer"
    (result,) = late
    assert result.status == "done" and result.output == "the answer", result.error
    assert [r.status for r in runs if r.parent_run_id is None] == ["done"]
    assert session is not None and session.status == "done"


async def test_a_late_resume_of_a_finished_session_writes_nothing_and_releases_it(
    db: Path | str,
) -> None:
    """The same gap, on both backends, as a duplicate DBOS workflow meets it: once the late
    resume has the lease it finds the session finished, and re-opens nothing. No
    ``running`` row after the finishing drive's ``done``, no second end, the lease given
    back (before: a ``running`` row after the ``done``, so a drive cut short there left a
    finished session looking unfinished, lease held, for ``wait`` to wait on for ever)."""
    agent = Agent(name="worker", instructions="Answer.")
    target = db if is_postgres(db) else Path(db)
    async with Runtime(db=target, model=FunctionModel(_network_down), retry=ONCE) as rt:
        first = await rt.run(agent, "go")
    assert first.status == "failed"  # unfinished and resumable
    sid = first.session_id

    finished, result = await _late_and_live(db, sid, agents=[agent])
    statuses = [
        r[0]
        for r in rows(
            db, "SELECT status FROM session_events WHERE session_id = ? ORDER BY id", (sid,)
        )
    ]
    assert finished.status == "done"
    assert result.status == "done" and result.output == "the answer", result.error
    assert statuses[-1] == "done" and statuses.count("done") == 1, statuses


async def _late_and_live(
    db: Path | str,
    sid: str,
    *,
    agents: Sequence[Agent] = (),
    graphs: Sequence[Graph] = (),
    answer: Callable[[ModelRequest], Any] = _answer,
) -> tuple[RunResult, RunResult]:
    """A resume of ``sid`` held between its reads and its lease while another runtime
    finishes the session; (the finishing result, the late one). The late runtime refuses
    model calls, and its lease is checked given back."""
    target = db if is_postgres(db) else Path(db)
    waiting, go = anyio.Event(), anyio.Event()
    late: list[RunResult] = []
    opened = await (GatedPostgresStore.open(str(db)) if is_postgres(db) else GatedStore.open(db))
    assert isinstance(opened, (GatedStore, GatedPostgresStore))
    opened.gate = (waiting, go)
    model, refuse = FunctionModel(answer), FunctionModel(_refuse)
    async with (
        opened as gated,
        Runtime(store=gated, model=refuse, agents=agents, graphs=graphs) as stale,
        Runtime(db=target, model=model, agents=agents, graphs=graphs) as live,
    ):
        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:

                async def resume_late() -> None:
                    late.append(await stale.resume(sid))

                group.start_soon(resume_late)
                await waiting.wait()  # it has read the session, not yet leased it
                finished = await live.resume(sid)
                go.set()
        assert await live.store.lease_holder(sid) is None
    return finished, late[0]


async def test_a_late_resume_of_a_finished_graph_writes_nothing(db: Path | str) -> None:
    """The same for a graph session (cancelled mid-task, then resumed twice at once)."""
    blocked, allow = anyio.Event(), [False]

    @tool(timeout=30)
    async def step() -> str:
        """Block until allowed."""
        if not allow[0]:
            blocked.set()
            await anyio.sleep_forever()
        return "stepped"

    def answer(request: ModelRequest) -> Any:
        if not any(m.role == "assistant" for m in request.messages):
            return [ToolUseBlock(id="toolu_step", name="step", input={})]
        return "the answer"

    agent = Agent(name="stepper", instructions="Step.", tools=[step])
    graph = Graph(tasks=[Task(id="only", agent=agent, prompt="go")], name="stepping")
    target = db if is_postgres(db) else Path(db)
    sessions: list[str] = []
    async with Runtime(db=target, model=FunctionModel(answer)) as rt:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(partial(rt.run_graph, graph, on_session=sessions.append))
                await blocked.wait()
                group.cancel_scope.cancel()
    allow[0] = True
    (sid,) = sessions
    finished, result = await _late_and_live(db, sid, graphs=[graph], answer=answer)
    statuses = [
        r[0]
        for r in rows(
            db, "SELECT status FROM session_events WHERE session_id = ? ORDER BY id", (sid,)
        )
    ]
    assert isinstance(finished, GraphResult) and finished.status == "done"
    assert isinstance(result, GraphResult) and result.status == "done", result.error
    assert result.output == "the answer"
    assert statuses[-1] == "done" and statuses.count("done") == 1, statuses


class _EndLost:
    """A real store whose writes of a session's end fail, as when the process stops
    between committing the root run's end and the session's: the root ended, the session
    still reads ``running``, the lease is given back (mixed into each backend's store)."""

    async def release_lease(
        self,
        session_id: str,
        owner: str,
        *,
        status: RunStatus | None = None,
        output: str | None = None,
        error: str | None = None,
    ) -> None:
        if status is not None:
            raise StoreError("the store failed: the process stopped here")
        await super().release_lease(session_id, owner)  # type: ignore[misc]


class EndLostStore(_EndLost, SQLiteStore):
    """``_EndLost`` on a SQLite file."""


class EndLostPostgresStore(_EndLost, PostgresStore):
    """``_EndLost`` on a real PostgreSQL."""


async def test_a_missing_end_recorded_while_a_late_resume_waited_is_not_recorded_again(
    db: Path | str,
) -> None:
    """A session whose root run ended but whose own end was never committed is resumed
    twice at once (a worker and a duplicate DBOS workflow of it): the one that takes the
    lease first records the end; the late one, which read the session as ``running``
    before that, finds it recorded under the lease and writes nothing (before: a second
    ``done`` row, a write to a finished session, which the SIGSTOP failover test caught
    as a fenced-looking write from a live worker)."""
    agent = Agent(name="worker", instructions="Answer.")
    opened = await (
        EndLostPostgresStore.open(str(db)) if is_postgres(db) else EndLostStore.open(db)
    )
    sessions: list[str] = []
    with anyio.fail_after(60):
        async with opened as store, Runtime(store=store, model=FunctionModel(_answer)) as rt:
            with pytest.raises(StoreError, match="stopped here"):
                await rt.run(agent, "go", on_session=sessions.append)
    (sid,) = sessions
    before = [
        r[0] for r in rows(db, "SELECT status FROM session_events WHERE session_id = ?", (sid,))
    ]
    assert before == ["running"]  # the root ended, the session's end is missing

    finished, result = await _late_and_live(db, sid, agents=[agent])
    statuses = [
        r[0]
        for r in rows(
            db, "SELECT status FROM session_events WHERE session_id = ? ORDER BY id", (sid,)
        )
    ]
    assert finished.status == "done" and finished.output == "the answer"
    assert result.status == "done" and result.output == "the answer", result.error
    assert statuses == ["running", "done"], statuses
