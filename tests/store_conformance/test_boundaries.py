"""Boundaries listed by run and by session: none, and several across a session's runs."""

from __future__ import annotations

import pytest

from anabranch.store import BoundaryRecord, Store
from tests.store_conformance.conftest import add_run, add_session

pytestmark = pytest.mark.anyio


def _boundary(run_id: str, summary: str) -> BoundaryRecord:
    return BoundaryRecord(
        run_id=run_id, kind="compaction", prefix="[]", ranges="[]", created=1.0, summary=summary
    )


async def test_boundaries_by_run_and_by_session(store: Store) -> None:
    await add_session(store, "ses_1")
    await add_session(store, "ses_2")
    await add_run(store, "run_a", "ses_1")
    await add_run(store, "run_b", "ses_1")
    await add_run(store, "run_c", "ses_2")
    assert await store.list_boundaries(session_id="ses_1") == []  # none yet
    assert await store.list_boundaries(run_id="run_a") == []
    first = await store.add_boundary(_boundary("run_a", "one"))
    await store.add_boundary(_boundary("run_b", "two"))
    await store.add_boundary(_boundary("run_a", "three"))
    by_session = await store.list_boundaries(session_id="ses_1")
    assert [(b.run_id, b.summary) for b in by_session] == [
        ("run_a", "one"),
        ("run_b", "two"),
        ("run_a", "three"),
    ]
    assert by_session[0].id == first
    by_run = await store.list_boundaries(run_id="run_a")
    assert [b.summary for b in by_run] == ["one", "three"]
    assert await store.list_boundaries(session_id="ses_2") == []
    assert await store.list_boundaries(run_id="run_c") == []
