"""Leases: one live owner drives a session at a time."""

from __future__ import annotations

import time

import pytest

from anabranch.errors import SessionBusyError
from anabranch.store import SessionRecord, Store
from tests.store_conformance.conftest import Backend, add_session

pytestmark = pytest.mark.anyio


async def test_one_live_owner_at_a_time(store: Store) -> None:
    await add_session(store)
    assert await store.lease_holder("ses_1") is None
    await store.acquire_lease("ses_1", "owner-a", ttl=60)
    await store.acquire_lease("ses_1", "owner-a", ttl=60)  # the holder may take it again
    assert await store.lease_holder("ses_1") == "owner-a"
    with pytest.raises(SessionBusyError) as caught:
        await store.acquire_lease("ses_1", "owner-b", ttl=60)
    assert caught.value.session_id == "ses_1"
    assert await store.renew_lease("ses_1", "owner-a", ttl=60) is True
    assert await store.renew_lease("ses_1", "owner-b", ttl=60) is False
    await store.release_lease("ses_1", "owner-b")  # not the holder: nothing happens
    assert await store.lease_holder("ses_1") == "owner-a"
    await store.release_lease("ses_1", "owner-a")
    assert await store.lease_holder("ses_1") is None
    await store.acquire_lease("ses_1", "owner-b", ttl=60)
    assert await store.lease_holder("ses_1") == "owner-b"


async def test_an_expired_lease_is_taken_over(backend: Backend) -> None:
    stalled, other = await backend.open(), await backend.open()
    await add_session(stalled)
    await stalled.acquire_lease("ses_1", "owner-a", ttl=-1.0)  # already expired
    assert await other.lease_holder("ses_1") is None
    await other.acquire_lease("ses_1", "owner-b", ttl=60)
    # the stalled owner finds out when it next renews
    assert await stalled.renew_lease("ses_1", "owner-a", ttl=60) is False
    assert await stalled.lease_holder("ses_1") == "owner-b"


async def test_leases_are_per_session(store: Store) -> None:
    await add_session(store, "ses_1")
    await add_session(store, "ses_2")
    await store.acquire_lease("ses_1", "owner-a", ttl=60)
    await store.acquire_lease("ses_2", "owner-b", ttl=60)
    assert await store.lease_holder("ses_1") == "owner-a"
    assert await store.lease_holder("ses_2") == "owner-b"


async def test_a_lease_is_taken_with_the_running_status_and_given_back_with_the_end(
    backend: Backend,
) -> None:
    store, other = await backend.open(), await backend.open()
    await add_session(store)
    await store.set_session_status("ses_1", "failed", error="earlier drive")
    await other.acquire_lease("ses_1", "owner-b", ttl=60)
    with pytest.raises(SessionBusyError):  # refused: nothing of that transaction is kept
        await store.acquire_lease("ses_1", "owner-a", ttl=60, running=True)
    session = await store.get_session("ses_1")
    assert session is not None and session.status == "failed"
    await other.release_lease("ses_1", "owner-b")
    before = backend.commits()
    await store.acquire_lease("ses_1", "owner-a", ttl=60, running=True)
    assert backend.commits() == before + 1  # the lease and the status: one transaction
    session = await other.get_session("ses_1")
    assert session is not None and session.status == "running"
    assert await other.lease_holder("ses_1") == "owner-a"
    before = backend.commits()
    await store.release_lease("ses_1", "owner-a", status="done", output="the answer")
    assert backend.commits() == before + 1
    session = await other.get_session("ses_1")
    assert session is not None
    assert (session.status, session.output, session.error) == ("done", "the answer", None)
    assert session.finished is not None
    assert await other.lease_holder("ses_1") is None


async def test_a_session_is_created_with_its_lease_in_one_transaction(backend: Backend) -> None:
    store, other = await backend.open(), await backend.open()
    before = backend.commits()
    await store.create_session(
        SessionRecord(id="ses_1", created=time.time(), kind="agent", entry="a", task="t"),
        owner="owner-a",
        ttl=60,
    )
    assert backend.commits() == before + 1  # the session, its lease and its status
    assert await other.lease_holder("ses_1") == "owner-a"
    session = await other.get_session("ses_1")
    assert session is not None and session.status == "running"
    with pytest.raises(SessionBusyError):  # held as if taken by acquire_lease
        await other.acquire_lease("ses_1", "owner-b", ttl=60)
    assert await store.renew_lease("ses_1", "owner-a", ttl=60) is True
    await store.release_lease("ses_1", "owner-a", status="done", output="the answer")
    session = await other.get_session("ses_1")
    assert session is not None and (session.status, session.output) == ("done", "the answer")
    assert await other.lease_holder("ses_1") is None


async def test_a_session_created_with_an_expired_lease_is_taken_over(backend: Backend) -> None:
    stalled, other = await backend.open(), await backend.open()
    await stalled.create_session(
        SessionRecord(id="ses_1", created=time.time(), kind="agent", entry="a", task="t"),
        owner="owner-a",
        ttl=-1.0,  # already expired
    )
    assert await other.lease_holder("ses_1") is None
    await other.acquire_lease("ses_1", "owner-b", ttl=60)
    assert await stalled.renew_lease("ses_1", "owner-a", ttl=60) is False
    assert await stalled.lease_holder("ses_1") == "owner-b"
