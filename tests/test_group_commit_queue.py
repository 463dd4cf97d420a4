"""``GroupCommit``'s queue on its own: who leads, what shares a batch, what a cancelled
writer leaves (the stores' group commit is checked end to end in the conformance suite).

The commit function here records its batches and can be held open, so the order of
events is set by the test, not by timing."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from anabranch.store._group_commit import GroupCommit, QueuedWrite

pytestmark = pytest.mark.anyio


class Committer:
    """Commits each job as its own result; the first ``held`` commits wait for ``release``."""

    def __init__(self, held: int = 1) -> None:
        self.batches: list[list[int]] = []
        self.release = anyio.Event()
        self.held = held

    async def __call__(self, batch: list[QueuedWrite[int]]) -> None:
        self.batches.append([write.job for write in batch])
        if len(self.batches) <= self.held:
            await self.release.wait()
        for write in batch:
            if write.job < 0:
                write.error = ValueError(f"job {write.job}")
            else:
                write.result = write.job * 10


async def test_writes_queued_behind_a_commit_share_the_next_one() -> None:
    commit = Committer()
    queue: GroupCommit[int] = GroupCommit(commit)
    results: dict[int, int] = {}

    async def submit(job: int) -> None:
        results[job] = await queue.submit(job)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(submit, 0)
            await anyio.wait_all_tasks_blocked()  # 0 is committing, held open
            for job in range(1, 6):
                group.start_soon(submit, job)
            await anyio.wait_all_tasks_blocked()
            assert commit.batches == [[0]]  # nothing else commits meanwhile
            commit.release.set()
    assert [sorted(batch) for batch in commit.batches] == [[0], [1, 2, 3, 4, 5]]
    assert results == {job: job * 10 for job in range(6)}


async def test_each_write_gets_its_own_outcome() -> None:
    commit = Committer()
    queue: GroupCommit[int] = GroupCommit(commit)
    outcomes: dict[int, str] = {}

    async def submit(job: int) -> None:
        try:
            outcomes[job] = str(await queue.submit(job))
        except ValueError as error:
            outcomes[job] = str(error)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(submit, 1)
            await anyio.wait_all_tasks_blocked()
            for job in (2, -3, 4):
                group.start_soon(submit, job)
            await anyio.wait_all_tasks_blocked()
            commit.release.set()
    assert outcomes == {1: "10", 2: "20", -3: "job -3", 4: "40"}


async def test_a_failing_commit_fails_its_writes_and_the_queue_goes_on() -> None:
    calls = []

    async def commit(batch: list[QueuedWrite[int]]) -> None:
        calls.append([write.job for write in batch])
        if len(calls) == 1:
            raise OSError("disk gone")
        for write in batch:
            write.result = write.job

    queue: GroupCommit[int] = GroupCommit(commit)
    with anyio.fail_after(10):
        with pytest.raises(OSError, match="disk gone"):
            await queue.submit(1)
        assert await queue.submit(2) == 2
    assert calls == [[1], [2]]


async def test_a_cancelled_next_leader_still_commits_and_the_others_do_not_hang() -> None:
    """The first writer queued behind a commit leads the next one. Cancelled while it
    waits, it must still lead (its write is not dropped) and then see its cancellation;
    the writers queued after it must get their results."""
    commit = Committer()
    queue: GroupCommit[int] = GroupCommit(commit)
    results: dict[int, int] = {}
    cancelled_seen: list[int] = []

    async def submit(job: int) -> None:
        try:
            results[job] = await queue.submit(job)
        except anyio.get_cancelled_exc_class():
            cancelled_seen.append(job)
            raise

    doomed = anyio.CancelScope()

    async def next_leader() -> None:
        with doomed:
            await submit(1)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(submit, 0)
            await anyio.wait_all_tasks_blocked()
            group.start_soon(next_leader)  # the next batch's leader
            await anyio.wait_all_tasks_blocked()
            for job in (2, 3):  # queued behind it
                group.start_soon(submit, job)
            await anyio.wait_all_tasks_blocked()
            doomed.cancel()
            await anyio.wait_all_tasks_blocked()
            assert cancelled_seen == []  # still waiting for its write to commit
            commit.release.set()
    assert [sorted(batch) for batch in commit.batches] == [[0], [1, 2, 3]]
    assert cancelled_seen == [1]
    assert results == {0: 0, 2: 20, 3: 30}


async def test_a_cancelled_follower_waits_for_its_write() -> None:
    commit = Committer()
    queue: GroupCommit[int] = GroupCommit(commit)
    order: list[str] = []

    doomed = anyio.CancelScope()

    async def follower() -> None:
        with doomed:
            try:
                await queue.submit(2)
            except anyio.get_cancelled_exc_class():
                order.append(f"cancelled after {commit.batches}")
                raise

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(queue.submit, 0)
            await anyio.wait_all_tasks_blocked()
            group.start_soon(queue.submit, 1)  # leads the next batch
            await anyio.wait_all_tasks_blocked()
            group.start_soon(follower)
            await anyio.wait_all_tasks_blocked()
            doomed.cancel()
            await anyio.wait_all_tasks_blocked()
            assert order == []
            commit.release.set()
    assert order == ["cancelled after [[0], [1, 2]]"]


async def test_a_waiting_write_holds_one_frame_of_the_queue(anyio_backend_name: str) -> None:
    """A write waiting for its batch holds ``submit``'s frame and what that awaits (on
    asyncio a bare future), not a chain of coroutines: every young collection while a
    batch commits walks what each writer in flight holds."""
    if anyio_backend_name != "asyncio":
        pytest.skip("the await chain of an asyncio task")
    import asyncio
    import types

    commit = Committer()
    queue: GroupCommit[int] = GroupCommit(commit)

    async def writer(job: int) -> None:
        await queue.submit(job)

    def chain(task: asyncio.Task[Any]) -> list[str]:
        """What the task awaits, from ``writer`` on: coroutines by name, then the rest."""
        names: list[str] = []
        awaited: Any = task.get_coro()
        while isinstance(awaited, types.CoroutineType):
            if names or awaited.__qualname__.endswith("writer"):
                names.append(awaited.__qualname__.rpartition(".")[2])
            awaited = awaited.cr_await
        return [*names, type(awaited).__name__] if names else []

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(writer, 0)
            await anyio.wait_all_tasks_blocked()  # 0 is committing, held open
            group.start_soon(writer, 1)  # the next batch's leader
            group.start_soon(writer, 2)  # a follower
            await anyio.wait_all_tasks_blocked()
            chains = sorted(chain(t) for t in asyncio.all_tasks())
            commit.release.set()
    queued = ["writer", "submit", "FutureIter"]  # a future's own iterator: no coroutine
    committing = ["writer", "submit", "_lead", "__call__", "wait", "wait", "FutureIter"]
    assert [c for c in chains if c] == sorted([committing, queued, queued])
    assert commit.batches == [[0], [1, 2]]
