"""The history search index reads text from messages and spills; it keeps no copy of it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from anabranch.store import MessageRecord, RunRecord, SessionRecord, SQLiteStore

pytestmark = pytest.mark.anyio


async def test_search_finds_messages_and_spills_without_a_second_copy(tmp_path: Path) -> None:
    async with await SQLiteStore.open(tmp_path / "db") as store:
        await store.create_session(
            SessionRecord(id="ses_1", created=time.time(), kind="agent", entry="a", task="t")
        )
        for run_id in ("run_1", "run_2"):
            await store.create_run(
                RunRecord(id=run_id, session_id="ses_1", agent_name="a", model="m", created=1.0)
            )
        await store.append_messages(
            [
                MessageRecord(
                    run_id="run_1",
                    seq=0,
                    role="user",
                    content='[{"type": "text", "text": "the vault code is zebra"}]',
                ),
                MessageRecord(
                    run_id="run_2",
                    seq=0,
                    role="user",
                    content='[{"type": "text", "text": "zebra elsewhere"}]',
                ),
            ]
        )
        await store.save_spill("out_1", "run_1", "toolu_1", "a long output about a zebra")
        hits = await store.search_history("run_1", "zebra")
        tables = await store.query("SELECT name FROM sqlite_master WHERE name LIKE 'history%'")
    assert sorted((h.source, h.ref) for h in hits) == [("message", "0"), ("spill", "out_1")]
    assert all("[zebra]" in h.snippet for h in hits)
    names = {t["name"] for t in tables}
    assert "history_fts" in names and "history_spill_fts" in names
    assert "history_fts_content" not in names  # external content: the text lives once
