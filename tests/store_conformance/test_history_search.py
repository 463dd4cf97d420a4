"""Full-text search over one run's history: original messages and spilled outputs."""

from __future__ import annotations

import json

import pytest

from anabranch.store import MessageRecord, Store, ToolEventRecord
from tests.store_conformance.conftest import add_run, add_session

pytestmark = pytest.mark.anyio


def _text(run_id: str, seq: int, text: str, kind: str = "message") -> MessageRecord:
    content = json.dumps([{"type": "text", "text": text}])
    return MessageRecord(run_id=run_id, seq=seq, role="user", content=content, kind=kind)


async def _history(store: Store) -> None:
    await add_session(store)
    await add_run(store, "run_1")
    await add_run(store, "run_2")
    await store.append_messages(
        [
            _text("run_1", 0, "the quarterly revenue of the walrus company"),
            _text("run_1", 1, "walrus tusks are long"),
            _text("run_1", 2, "a stub that only a compacted context refers to", kind="context"),
        ]
    )
    await store.append_messages([_text("run_2", 0, "quarterly revenue elsewhere")])
    await store.save_spill("spill_1", "run_1", "toolu_1", "a huge tool output about zebras")


async def test_every_word_must_match_first(store: Store) -> None:
    await _history(store)
    hits = await store.search_history("run_1", "walrus revenue")
    assert [(h.source, h.ref) for h in hits] == [("message", "0")]
    assert "[" in hits[0].snippet and "]" in hits[0].snippet  # the match is marked


async def test_any_word_when_no_message_has_all(store: Store) -> None:
    await _history(store)
    hits = await store.search_history("run_1", "walrus zebras")
    assert {(h.source, h.ref) for h in hits} == {
        ("message", "0"),
        ("message", "1"),
        ("spill", "spill_1"),
    }
    assert len(await store.search_history("run_1", "walrus zebras", limit=1)) == 1


async def test_search_stays_in_its_run_and_skips_derived_messages(store: Store) -> None:
    await _history(store)
    assert [h.ref for h in await store.search_history("run_2", "quarterly")] == ["0"]
    assert await store.search_history("run_1", "compacted stub") == []
    assert await store.search_history("run_1", "zebras") != []
    assert await store.search_history("run_2", "zebras") == []


async def test_hostile_queries_are_words_not_syntax(store: Store) -> None:
    await _history(store)
    assert await store.search_history("run_1", "") == []
    assert await store.search_history("run_1", '"*') == []  # no word in it
    hits = await store.search_history("run_1", 'tusks" OR NEAR(x) AND -')
    assert [h.ref for h in hits] == ["1"]


def _finished(call_id: str, content: str, run_id: str = "run_1") -> ToolEventRecord:
    return ToolEventRecord(
        run_id=run_id, call_id=call_id, name="t", event="finished", created=1.0, content=content
    )


def _ref(call_id: str) -> dict[str, str]:
    return {"type": "tool_result", "tool_use_id": call_id, "ref": "tool_event"}


async def test_a_result_stored_as_a_reference_is_searched_by_its_events_text(
    store: Store,
) -> None:
    """A message block that refers to its call's finished event (the output stored once)
    is found by the event's text, as part of its message (words across its blocks)."""
    await add_session(store)
    await add_run(store, "run_1")
    await add_run(store, "run_2")
    await store.record_tool_event(_finished("toolu_1", "penguins huddle in winter"))
    await store.record_tool_event(_finished("toolu_1", "penguins elsewhere", run_id="run_2"))
    blocks = [{"type": "text", "text": "field notes"}, _ref("toolu_1")]
    await store.append_messages(
        [MessageRecord(run_id="run_1", seq=0, role="user", content=json.dumps(blocks))]
    )
    hits = await store.search_history("run_1", "penguins winter")
    assert [(h.source, h.ref) for h in hits] == [("message", "0")]
    assert "penguins" in hits[0].snippet
    assert [h.ref for h in await store.search_history("run_1", "notes huddle")] == ["0"]
    assert await store.search_history("run_1", "elsewhere") == []  # another run's event
    assert await store.search_history("run_2", "penguins") == []  # no message refers to it


async def test_a_word_the_index_splits_matches_its_parts(store: Store) -> None:
    """``walrus_tusks`` is two words to the index: it matches what has both, anywhere."""
    await _history(store)
    assert [h.ref for h in await store.search_history("run_1", "walrus_tusks")] == ["1"]
    assert [h.ref for h in await store.search_history("run_1", "tusks_walrus")] == ["1"]


async def test_a_spill_of_its_calls_output_is_read_and_searched_by_the_events_text(
    store: Store,
) -> None:
    """A spill equal to its call's finished event (a spilled output, stored once) reads
    back whole and is found by that text; a spill that differs keeps its own text."""
    await add_session(store)
    await add_run(store, "run_1")
    await store.record_tool_event(_finished("toolu_1", "first try"))
    await store.record_tool_event(_finished("toolu_1", "otters juggle pebbles"))
    await store.save_spill("spill_1", "run_1", "toolu_1", "otters juggle pebbles")
    await store.save_spill("spill_2", "run_1", "toolu_1", "otters and a different text")
    await store.save_spill("spill_1", "run_1", "toolu_1", "a second save keeps the first")
    assert await store.get_spill("spill_1") == "otters juggle pebbles"
    assert await store.get_spill("spill_2") == "otters and a different text"
    record = await store.get_spill_record("spill_1")
    assert record is not None
    assert (record.run_id, record.call_id, record.content) == (
        "run_1",
        "toolu_1",
        "otters juggle pebbles",
    )
    hits = await store.search_history("run_1", "juggle")
    assert [(h.source, h.ref) for h in hits] == [("spill", "spill_1")]
    assert "juggle" in hits[0].snippet
    assert {h.ref for h in await store.search_history("run_1", "otters")} == {
        "spill_1",
        "spill_2",
    }
