"""What a hot SQLite write keeps alive while it waits for its batch.

The three writes of every model call (``begin_call``, ``finish_call``,
``record_tool_event``) hand the group commit a module function bound with
``functools.partial`` to rows held in tuples: no closure (a function, its closure tuple
and a cell per captured name) and no list per group of rows, which every young
collection walked while the batch waited for the writer thread. The rows still commit
as before (the conformance suite checks what they write).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import pytest

from anabranch.store import (
    CallRecord,
    MessageRecord,
    RunRecord,
    SessionRecord,
    SpillRecord,
    SQLiteStore,
    ToolEventRecord,
)
from anabranch.store._group_commit import GroupCommit

pytestmark = pytest.mark.anyio


def _event(kind: Any) -> ToolEventRecord:
    return ToolEventRecord(
        run_id="run_1", call_id="toolu_1", name="t", event=kind, content="ok", created=1.0
    )


async def test_a_hot_write_in_flight_holds_no_closure_and_no_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs: list[Any] = []
    submit = GroupCommit.submit

    def spy(self: GroupCommit[Any], job: Any) -> Any:
        jobs.append(job)
        return submit(self, job)

    async with await SQLiteStore.open(tmp_path / "s.db") as store:
        await store.create_session(
            SessionRecord(id="ses_1", created=1.0, kind="agent", entry="a", task="t")
        )
        await store.create_run(
            RunRecord(id="run_1", session_id="ses_1", agent_name="a", model="m", created=1.0)
        )
        monkeypatch.setattr(GroupCommit, "submit", spy)
        message = MessageRecord(run_id="run_1", seq=0, role="user", content="[]")
        call = CallRecord(
            run_id="run_1", turn=1, attempt=1, fingerprint="ab", message_count=1, created=1.0
        )
        call_id = await store.begin_call(call, [message])
        answer = MessageRecord(run_id="run_1", seq=1, role="assistant", content="[]")
        started = [_event("started")]
        await store.finish_call(call_id, status="ok", message=answer, tool_events=started)
        spill = SpillRecord("h1", "run_1", "toolu_1", "ok", time.time())
        await store.record_tool_event(_event("finished"), spills=[spill])
        again = CallRecord(
            run_id="run_1", turn=2, attempt=1, fingerprint="cd", message_count=2, created=1.0
        )
        await store.begin_call(again, [], tool_event=_event("finished"))
        assert len(await store.list_calls("run_1")) == 2
    assert len(jobs) == 4
    for job in jobs:
        assert isinstance(job, functools.partial), job
        assert getattr(job.func, "__closure__", None) is None
        assert not job.keywords
        for argument in job.args:
            assert type(argument) in (dict, tuple, type(None)), argument
            if type(argument) is tuple:
                assert all(type(row) is dict for row in argument)
