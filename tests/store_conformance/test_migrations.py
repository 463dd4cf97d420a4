"""Opening a database: created at the current schema, migrated forward, or refused."""

from __future__ import annotations

import json

import pytest

from anabranch.errors import DatabaseError, StoreError
from anabranch.store import MessageRecord, ToolEventRecord
from tests.store_conformance.conftest import Backend, add_run, add_session

pytestmark = pytest.mark.anyio


async def test_a_reopened_database_keeps_everything(backend: Backend) -> None:
    store = await backend.open()
    await add_session(store)
    await add_run(store)
    await store.close()
    again = await backend.open()
    assert [r.id for r in await again.list_runs("ses_1")] == ["run_1"]


@pytest.mark.parametrize("version", [1, 2, 3, 4])
async def test_an_older_schema_is_migrated_keeping_its_rows(backend: Backend, version: int) -> None:
    if version >= backend.schema_version:
        pytest.skip("no such older version")
    await backend.make_old(version)
    store = await backend.open()
    session = await store.get_session("ses_old")
    assert session is not None and (session.status, session.output) == ("done", "kept")
    await add_session(store)  # and the current schema's features work on it
    await add_run(store)
    await store.save_spill("spill_1", "run_1", "toolu_1", "migrated search works")
    assert [h.ref for h in await store.search_history("run_1", "migrated")] == ["spill_1"]


async def test_a_newer_schema_is_refused_without_a_write(backend: Backend) -> None:
    store = await backend.open()
    await add_session(store)
    await store.close()
    await backend.stamp_version(backend.schema_version + 1)
    before = await backend.fingerprint()
    with pytest.raises(DatabaseError, match="newer"):
        await backend.open()
    assert await backend.fingerprint() == before


def test_a_database_error_is_a_store_error() -> None:
    assert issubclass(DatabaseError, StoreError)


def _finished(content: str) -> ToolEventRecord:
    return ToolEventRecord(
        run_id="run_1", call_id="toolu_1", name="t", event="finished", created=1.0, content=content
    )


@pytest.mark.parametrize("version", [1, 2, 8])
async def test_a_migrated_store_searches_results_stored_as_references(
    backend: Backend, version: int
) -> None:
    """Migrated forward, a store finds a tool result a message refers to (stored once)."""
    if version >= backend.schema_version:
        pytest.skip("no such older version")
    await backend.make_old(version)
    store = await backend.open()
    await add_session(store)
    await add_run(store)
    await store.record_tool_event(_finished("narwhals surface"))
    ref = {"type": "tool_result", "tool_use_id": "toolu_1", "ref": "tool_event"}
    await store.append_messages(
        [MessageRecord(run_id="run_1", seq=0, role="user", content=json.dumps([ref]))]
    )
    assert [h.ref for h in await store.search_history("run_1", "narwhals")] == ["0"]


@pytest.mark.parametrize("version", [1, 4, 11])
async def test_a_migrated_store_reads_and_searches_spills_stored_as_references(
    backend: Backend, version: int
) -> None:
    """Migrated forward, a spill equal to its call's finished event is read back whole and
    searched by the event's text; a spill that is no event's keeps its own."""
    if version >= backend.schema_version:
        pytest.skip("no such older version")
    await backend.make_old(version)
    store = await backend.open()
    await add_session(store)
    await add_run(store)
    await store.save_spill("spill_old", "run_1", "toolu_0", "beluga whistles")
    await store.record_tool_event(_finished("orcas hunt"))
    await store.save_spill("spill_1", "run_1", "toolu_1", "orcas hunt")
    assert await store.get_spill("spill_1") == "orcas hunt"
    assert await store.get_spill("spill_old") == "beluga whistles"
    assert [h.ref for h in await store.search_history("run_1", "orcas")] == ["spill_1"]
    assert [h.ref for h in await store.search_history("run_1", "beluga")] == ["spill_old"]
