"""A new run's start rows and its first call's row commit together (``create_run(call=)``):
a process killed right after that commit, before the request leaves, leaves a store the
session resumes from exactly once (the call is closed as interrupted and sent again).

``test_crash`` reaches these points only at random; here each of the scenario's first
model requests is the kill point of its own chain."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from anabranch.testing import MessagesServer
from tests.crash.harness import (
    Chain,
    Harness,
    KillPoint,
    KillSwitch,
    check_chain,
    request_keys,
    transcript,
)
from tests.crash.scenario import ScenarioModel

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

_LEFT = (
    "SELECT (SELECT COUNT(*) FROM runs), (SELECT COUNT(*) FROM calls c WHERE NOT EXISTS "
    "(SELECT 1 FROM call_outcomes o WHERE o.call_id = c.id))"
)


class _Inspecting(Harness):
    """Records what each killed attempt left: runs, and calls still in flight."""

    left: list[tuple[int, int]]

    async def attempt(self, chain: Chain, kill: KillPoint | None) -> bool:
        killed = await super().attempt(chain, kill)
        if killed:
            with closing(sqlite3.connect(chain.db)) as conn:
                self.left.append(conn.execute(_LEFT).fetchone())
        return killed


async def test_killed_after_the_first_calls_commit_then_resumed_finishes_exactly_once(
    tmp_path: Path, anyio_backend: str
) -> None:
    switch = KillSwitch(ScenarioModel())
    async with MessagesServer(policy=switch) as server:
        harness = _Inspecting(server.base_url, anyio_backend, switch, synchronous="NORMAL")
        harness.left = []
        reference_chain = await harness.run_chain(tmp_path / "reference", [])
        assert reference_chain.session_id is not None
        reference = transcript(reference_chain.db, reference_chain.session_id)
        sent = request_keys(server.log)
        for at in (1, 2, 3):
            log_start = len(server.log)
            chain = await harness.run_chain(tmp_path / f"request-{at}", [KillPoint("request", at)])
            assert [str(k) for k in chain.kills] == [f"request#{at}"]
            problems = check_chain(chain, reference, server.log[log_start:], sent)
            assert not problems, f"killed at request#{at}:\n" + "\n".join(problems)
    # the first kill: the root run, its task and its first call, in flight, all committed
    assert harness.left[0] == (1, 1)
    assert all(in_flight >= 1 for _, in_flight in harness.left)
