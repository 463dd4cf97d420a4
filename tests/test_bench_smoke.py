"""The benchmark harness measures what it claims: complete transcripts, right counts.

Tiny sizes, no timings asserted (timings live in ``bench/``, never in the test suite).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import concurrency, persistence, resume, wal_pages  # noqa: E402

pytestmark = pytest.mark.anyio


async def test_persistence_contenders_store_the_whole_conversation(tmp_path: Path) -> None:
    floor = await persistence.run_floor(tmp_path, 6, "NORMAL")
    ours = await persistence.run_anabranch(tmp_path, 6, "NORMAL")
    assert floor.loaded_messages == ours.loaded_messages == 24  # 4 messages a turn
    assert len(ours.per_turn) == 6 and ours.bytes > 0
    assert ours.extra["model_calls"] == 12  # a tool call and a reply per turn
    assert ours.extra["spans"] > 0  # tracing was on


@pytest.mark.parametrize("mix", ["root", "supervisor"])
async def test_concurrency_trial_checks_every_transcript(tmp_path: Path, mix: str) -> None:
    result = await concurrency.trial(tmp_path, 9, latency=0.001, synchronous="NORMAL", mix=mix)
    assert result["errors"] == 0 and result["lock_errors"] == 0
    assert result["runs"] == 9 and result["sessions"] == (9 if mix == "root" else 3)
    assert result["all_complete"] and result["transcripts_complete"] == 9
    assert result["model_calls"] == 9 * concurrency.CALLS_PER_RUN
    assert 0 <= result["gc_ms_per_model_call"] <= result["cpu_ms_per_model_call"]


async def test_resume_reads_only_after_the_last_boundary(tmp_path: Path) -> None:
    path = tmp_path / "long.db"
    session_id, count = await resume.build_session(path, 300, compactions=3)
    figures = await resume.measure(path, session_id)
    assert count >= 290
    # the last boundary keeps ~100 messages: the summary plus those are all that is loaded
    assert 90 <= figures["context_messages"] <= 110
    assert figures["request_messages"] == figures["context_messages"]


async def test_wal_pages_counts_each_commits_pages_by_btree(tmp_path: Path) -> None:
    batches, calls = await wal_pages.record(tmp_path, 3, 0.001)
    assert calls == 3 * concurrency.CALLS_PER_RUN
    commits, frames = wal_pages.pages(tmp_path, batches)
    assert commits == len(batches)  # every write transaction committed again, once
    assert sum(frames.values()) >= commits  # a commit writes at least one page
    # every model call's rows are in the WAL, under the b-trees that hold them
    assert {"messages", "calls", "idx_messages_run_id_seq", "history_fts_data"} <= set(frames)
