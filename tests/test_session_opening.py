"""A new session is committed with its lease (``SessionDriver.opening``), on both stores.

From the moment ``run`` announces the session's id, the session is recorded running and
its lease is this runtime's: no other process can take it. If anything between the commit
and the drive fails (here ``on_session``), the lease is given back and the session stays
resumable.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from anabranch import Agent, Runtime
from anabranch.errors import SessionBusyError
from anabranch.messages import ModelRequest
from anabranch.testing import FunctionModel
from tests.databases import Db

pytestmark = pytest.mark.anyio


async def test_a_session_is_held_by_its_runtime_from_its_announcement(db: Db) -> None:
    agent = Agent(name="worker")
    announced = anyio.Event()
    proceed = anyio.Event()
    ids: list[str] = []

    async def answer(request: ModelRequest) -> str:
        await proceed.wait()
        return "done"

    with anyio.fail_after(30):
        async with Runtime(db=db, model=FunctionModel(answer)) as rt:
            async with anyio.create_task_group() as group:

                async def run() -> None:
                    result = await rt.run(agent, "q", on_session=_announce(ids, announced))
                    assert result.status == "done"

                group.start_soon(run)
                await announced.wait()
                holder = await rt.store.lease_holder(ids[0])
                session = await rt.store.get_session(ids[0])
                assert holder is not None and session is not None
                assert session.status == "running"
                async with Runtime(db=db, model=FunctionModel(_refuse), agents=[agent]) as other:
                    with pytest.raises(SessionBusyError):
                        await other.resume(ids[0])
                proceed.set()
            assert await rt.store.lease_holder(ids[0]) is None


def _announce(ids: list[str], announced: anyio.Event) -> Callable[[str], None]:
    def on_session(session_id: str) -> None:
        ids.append(session_id)
        announced.set()

    return on_session


async def test_an_announcement_that_fails_gives_the_lease_back(db: Db) -> None:
    agent = Agent(name="worker")
    ids: list[str] = []

    def on_session(session_id: str) -> None:
        ids.append(session_id)
        raise ValueError("the caller's callback failed")

    with anyio.fail_after(30):
        async with Runtime(db=db, model=FunctionModel(lambda request: "unused")) as rt:
            with pytest.raises(ValueError, match="callback failed"):
                await rt.run(agent, "q", on_session=on_session)
            assert await rt.store.lease_holder(ids[0]) is None
        async with Runtime(
            db=db, model=FunctionModel(lambda request: "hello"), agents=[agent]
        ) as rt:
            result = await rt.resume(ids[0])  # nothing was lost: it runs from the start
    assert result.status == "done" and result.output == "hello"


def _refuse(request: ModelRequest) -> str:
    raise AssertionError("a session another process holds was driven")
