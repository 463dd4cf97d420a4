"""``bench/workers.py`` end to end at a tiny size: worker processes serve every queued
session to the end on one PostgreSQL, and the figures it reports are computed from what
was measured. Its timings are not checked (they never gate anything); the 1,000- and
10,000-agent runs are ``python bench/workers.py``, never part of the suite."""

from __future__ import annotations

import pytest
from bench import concurrency, workers

from tests.postgres_cluster import Cluster

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the benchmark's driver; its workers are subprocesses


async def test_the_workers_benchmark_runs_every_session_to_the_end(
    postgres_cluster: Cluster,
) -> None:
    result = await workers.trial(postgres_cluster, sessions=3, workers=1, latency=0.01)
    assert result["sessions_done"] == 3
    assert result["model_calls"] == 3 * concurrency.CALLS_PER_RUN
    assert result["all_complete"]
    assert result["done_rows"] == 3 and result["sessions_reopened_after_done"] == 0
    assert result["sessions_leased_again"] == 0 and result["recoveries_logged"] == 0
    assert result["worker_cpu_ms_per_model_call"] > 0
    bound = workers.lower_bound(result, cores=2)
    per_call = result["worker_cpu_ms_per_model_call"] + result["postgres_cpu_ms_per_model_call"]
    assert bound["cpu_bound_wall_s"] == pytest.approx(result["model_calls"] * per_call / 2e3)
    assert bound["cpu_bound_over_ideal"] == pytest.approx(
        bound["cpu_bound_wall_s"] / result["ideal_s"]
    )
