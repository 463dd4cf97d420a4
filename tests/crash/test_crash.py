"""The crash test: SIGKILL a real session at many points, resume it by id, compare.

Per backend and session kind (a supervisor with parallel children at depths 1 and 2; a
task graph whose tasks run in parallel and spawn): one uninterrupted reference session,
then chains of attempts against the local Messages API server. Every attempt is a
subprocess killed at the next point of a seeded stream that takes every kind of kill point
in turn (see ``harness``); the next attempt resumes the session by id, until one finishes
it. Each finished chain must match the reference exactly (see ``harness.check_chain``).
Per backend, at least ``MIN_KILLS`` attempts of the supervisor session and
``MIN_GRAPH_KILLS`` of the graph session are actually killed; ``bench/crash.py`` runs the
same at 500+ points.

SQLite runs with ``synchronous=NORMAL`` here: in WAL mode that loses nothing when a
*process* dies (only an OS crash can lose the last commits), and it makes the test several
times faster. The benchmark runs with the default, ``FULL``.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from anabranch.testing import MessagesServer
from tests.crash.harness import (
    ALL_EVENTS,
    Harness,
    KillSwitch,
    check_chain,
    random_kill_points,
    request_keys,
    transcript,
)
from tests.crash.scenario import ScenarioModel

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

MIN_KILLS = 50
MIN_GRAPH_KILLS = 20
MAX_CHAINS = 200
SEED = 7


@pytest.mark.parametrize(
    ("kind", "min_kills"),
    [("agent", MIN_KILLS), ("graph", MIN_GRAPH_KILLS)],
    ids=["supervisor", "graph"],
)
async def test_sigkill_anywhere_then_resume_by_id_finishes_exactly_once(
    tmp_path: Path, anyio_backend: str, kind: str, min_kills: int
) -> None:
    switch = KillSwitch(ScenarioModel())
    async with MessagesServer(policy=switch) as server:
        harness = Harness(server.base_url, anyio_backend, switch, synchronous="NORMAL", kind=kind)
        first = await harness.run_chain(tmp_path / "reference", [])
        assert first.session_id is not None and not first.kills
        reference = transcript(first.db, first.session_id)
        assert reference.session[0] == "done"
        assert reference.tool_results, "the scenario must call tools"
        sent = request_keys(server.log)
        assert not check_chain(first, reference, server.log, sent)

        compacts = any(run[5] for run in reference.runs)
        events = [e for e in ALL_EVENTS if e != "summary" or compacts]
        points = random_kill_points(random.Random(f"{SEED}-{kind}-{anyio_backend}"), events)
        killed: Counter[str] = Counter()
        chains = 0
        # Until enough attempts were killed, and each kind of point killed one at least.
        while sum(killed.values()) < min_kills or (
            set(events) - set(killed) and chains < MAX_CHAINS
        ):
            chains += 1
            log_start = len(server.log)
            chain = await harness.run_chain(tmp_path / f"chain-{chains}", points)
            problems = check_chain(chain, reference, server.log[log_start:], sent)
            assert not problems, (
                f"chain {chains}, killed at {[str(k) for k in chain.kills]}:\n"
                + "\n".join(problems)
            )
            killed.update(k.event for k in chain.kills)

    assert set(killed) == set(events), f"kill points never reached: {set(events) - set(killed)}"
