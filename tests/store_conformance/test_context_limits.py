"""Context limits: what a channel taught is found by (model, channel) from any connection;
what each run started with is listed per session."""

from __future__ import annotations

import pytest

from anabranch.store import ContextLimitRecord
from tests.store_conformance.conftest import Backend, add_run, add_session

pytestmark = pytest.mark.anyio


def _limit(
    maximum: int, *, run_id: str | None = None, channel: str = "https://gw"
) -> ContextLimitRecord:
    return ContextLimitRecord(
        model="m",
        channel=channel,
        maximum=maximum,
        ratio=1.5,
        window=int(maximum / 1.5),
        source="learned",
        created=1.0,
        run_id=run_id,
    )


async def test_the_latest_taught_limit_is_found_by_model_and_channel(backend: Backend) -> None:
    writer, reader = await backend.open(), await backend.open()
    assert await reader.context_limit("m", "https://gw") is None
    await writer.save_context_limit(_limit(9_000))
    await writer.save_context_limit(_limit(6_000))
    await writer.save_context_limit(_limit(3_000, channel="bedrock:us-east-1"))
    found = await reader.context_limit("m", "https://gw")
    assert found == _limit(6_000)
    assert await reader.context_limit("other", "https://gw") is None


async def test_a_runs_limit_is_listed_with_its_session_not_as_taught(backend: Backend) -> None:
    store = await backend.open()
    await add_session(store)
    await add_run(store)
    await add_session(store, "ses_2")
    await add_run(store, "run_2", "ses_2")
    await store.save_context_limit(_limit(6_000, run_id="run_1"))
    await store.save_context_limit(_limit(5_000, run_id="run_2"))
    assert await store.run_context_limits("ses_1") == [_limit(6_000, run_id="run_1")]
    assert await store.context_limit("m", "https://gw") is None  # a run's row teaches nothing
