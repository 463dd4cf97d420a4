"""A channel's context limit is kept: a resumed run and the next session start with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from anabranch import Agent, ContextPolicy, RetryPolicy, Runtime
from anabranch.cli import main
from anabranch.errors import OverloadedError, UserError
from anabranch.messages import ModelRequest
from anabranch.models import AnthropicModel
from anabranch.models._gateway import public_channel
from anabranch.store import SQLiteStore
from anabranch.testing import FunctionModel, MessagesServer, TestModel
from anabranch.testing._models import is_summary_request

from .compaction_helpers import fetch
from .gateway_helpers import gateway_shim

pytestmark = pytest.mark.anyio

FAST = RetryPolicy(max_attempts=1, base_delay=0, max_delay=0)
GATEWAY_WINDOW = 1_800
MODEL = "claude-sonnet-5-5"


def _worker() -> Agent:
    return Agent(
        name="worker",
        model=MODEL,
        instructions="Research the topic with your tools, then report.",
        tools=[fetch],
        context=ContextPolicy(
            window=100_000,
            compact_at=0.7,
            output_reserve=200,
            keep_recent=4,
            tool_result_max_chars=800,
            tool_result_preview_chars=200,
        ),
        max_turns=80,
    )


async def test_a_resumed_run_and_the_next_session_start_with_the_learned_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "limits.db"
    with anyio.fail_after(90):
        inner = TestModel(rounds=14)
        broken = {"on": False}

        def upstream(request: ModelRequest) -> Any:
            # after the refusal the upstream breaks, once the compaction's summary (in
            # however many parts) is written: the next turn of the run fails
            if broken["on"] and not is_summary_request(request):
                raise OverloadedError("Overloaded", status_code=529, error_type="overloaded_error")
            return inner.respond(request)

        async with MessagesServer(FunctionModel(upstream)) as srv:

            def fail_after_the_summary() -> None:  # the upstream breaks after the compaction
                broken["on"] = True

            async with gateway_shim(srv.base_url, max_input_tokens=GATEWAY_WINDOW, ratio=1.6) as gw:
                gw.on_refuse = fail_after_the_summary
                channel = public_channel(gw.base_url)
                # 1. the gateway refuses once; the run compacts, then the upstream fails
                model = AnthropicModel(base_url=gw.base_url, api_key="test")
                try:
                    async with Runtime(db=db, model=model, retry=FAST) as rt:
                        ids: list[str] = []
                        failed = await rt.run(_worker(), "Research SQLite", on_session=ids.append)
                finally:
                    await model.aclose()
                assert failed.status == "failed" and "Overloaded" in (failed.error or "")
                assert len(gw.refused) == 1
                broken["on"] = False
                # 2. a new process (a fresh pipeline) resumes: the limit comes from the store
                model = AnthropicModel(base_url=gw.base_url, api_key="test")
                try:
                    async with Runtime(db=db, model=model, retry=FAST) as rt:
                        resumed = await rt.resume(ids[0], _worker())
                        # 3. and the next session starts with it as well
                        second = await rt.run(_worker(), "Research DuckDB")
                finally:
                    await model.aclose()
    assert resumed.status == "done" and second.status == "done"
    assert len(gw.refused) == 1, "the learned limit should have kept every later prompt under it"
    async with await SQLiteStore.open(db, create=False) as store:
        taught = await store.context_limit(MODEL, channel)
        first_runs = await store.run_context_limits(ids[0])
        second_runs = await store.run_context_limits(second.session_id)
    assert taught is not None and taught.maximum == GATEWAY_WINDOW and taught.source == "learned"
    assert 1.4 < taught.ratio < 1.8 and taught.window < GATEWAY_WINDOW / 1.4
    # one row when the run learned it, one when the resumed run started with it
    assert [(r.run_id, r.window) for r in first_runs] == [(resumed.run_id, taught.window)] * 2
    assert [(r.run_id, r.window) for r in second_runs] == [(second.run_id, taught.window)]
    assert await anyio.to_thread.run_sync(main, ["show", second.session_id, "--db", str(db)]) == 0
    shown = capsys.readouterr().out
    assert f"window={taught.window:,} (learned from {channel}: 1,800 by its count, x" in shown


async def test_a_configured_window_is_in_force_and_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "configured.db"
    with anyio.fail_after(60):
        async with MessagesServer(TestModel(rounds=10), context_limit=2_000) as srv:
            channel = public_channel(srv.base_url)
            model = AnthropicModel(base_url=srv.base_url, api_key="test", context_window=2_000)
            try:
                async with Runtime(db=db, model=model, retry=FAST) as rt:
                    result = await rt.run(_worker(), "Research SQLite")
            finally:
                await model.aclose()
    assert result.status == "done"
    assert all(r.status == 200 for r in srv.log), "the configured window was not kept"
    assert await anyio.to_thread.run_sync(main, ["show", result.session_id, "--db", str(db)]) == 0
    shown = capsys.readouterr().out
    assert f"window=2,000 (configured from {channel})" in shown
    with pytest.raises(UserError, match="context_window must be a positive token count"):
        AnthropicModel(api_key="test", context_window=0)


async def test_a_declared_window_is_shown_as_declared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "declared.db"
    async with Runtime(db=db, model=TestModel(rounds=1)) as rt:
        result = await rt.run(_worker(), "Research SQLite")
    assert await anyio.to_thread.run_sync(main, ["show", result.session_id, "--db", str(db)]) == 0
    assert "window=100,000 (declared)" in capsys.readouterr().out
