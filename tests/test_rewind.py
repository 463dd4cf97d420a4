"""Rewinding a run to before a compaction, the breaker bookkeeping, and the CLI commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from anabranch import Runtime
from anabranch.context._compaction import CompactionEvent, is_compaction_message
from anabranch.errors import ModelAPIError, SessionBusyError, UserError
from anabranch.messages import Message, ModelRequest
from anabranch.runtime._breaker import (
    COOL_DOWN,
    breaker_open,
    breaker_state,
    consecutive_failures,
)
from anabranch.runtime._loop import AgentRun
from anabranch.store import BoundaryRecord
from anabranch.testing import FunctionModel
from anabranch.testing._models import is_summary_request

from .compaction_helpers import Checked, small_agent
from .helpers import failed_with, sql

ROOT = Path(__file__).resolve().parents[1]


def _id(boundary: BoundaryRecord) -> int:
    assert boundary.id is not None, "a committed boundary has an id"
    return boundary.id


async def _load(rt: Runtime, session_id: str, agent: Any) -> AgentRun:
    runs = await rt.store.list_runs(session_id)
    root = next(r for r in runs if r.parent_run_id is None)
    return await AgentRun.load(rt.environment(session_id), agent, root)


def _capturing_agent(contexts: list[list[Message]], **policy: Any) -> Any:
    def hook(event: CompactionEvent) -> None:
        contexts.append([*event.messages, *event.kept])

    return small_agent(on_compact=hook, **policy)


@pytest.mark.anyio
async def test_rewind_restores_the_context_from_before_a_compaction(tmp_path: Path) -> None:
    contexts: list[list[Message]] = []
    agent = _capturing_agent(contexts)
    async with Runtime(db=tmp_path / "r.db", model=Checked(rounds=14).model) as rt:
        result = await rt.run(agent, "Research SQLite")
        boundaries = await rt.store.list_boundaries(session_id=result.session_id)
        assert len(boundaries) >= 3 and len(contexts) == len(boundaries)
        rows_before = await sql(rt.store, "SELECT * FROM messages ORDER BY id")
        after_first = (await _load(rt, result.session_id, agent)).context
        record = await rt.rewind(result.session_id, result.run_id, _id(boundaries[1]))
        restored = (await _load(rt, result.session_id, agent)).context
        rows_after = await sql(rt.store, "SELECT * FROM messages ORDER BY id")
        # rewinding again, to before the very first compaction, gives the raw history
        await rt.rewind(result.session_id, result.run_id, _id(boundaries[0]))
        raw = (await _load(rt, result.session_id, agent)).context
    assert restored == contexts[1]
    assert is_compaction_message(restored[0])  # the first compaction is still in effect
    assert raw == contexts[0] and raw[0].text == "Research SQLite"
    assert record.kind == "rewind" and record.status == "ok" and record.id is not None
    assert record.messages_after == len(contexts[1])
    assert record.messages_before == len(after_first)
    assert rows_after == rows_before  # nothing was rewritten: the old branch stays readable


@pytest.mark.anyio
async def test_a_resumed_run_continues_from_the_rewound_context(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    contexts: list[list[Message]] = []
    agent = _capturing_agent(contexts)
    inner = Checked(rounds=14)
    main_calls = {"n": 0}

    def crash_late(request: ModelRequest) -> Any:
        if not is_summary_request(request):
            main_calls["n"] += 1
            if main_calls["n"] == 12:
                raise ModelAPIError("invalid request", status_code=400)
        return inner.model.function(request)

    async with Runtime(db=db, model=FunctionModel(crash_late), agents=[agent]) as rt:
        failed_with(await rt.run(agent, "Research SQLite"), ModelAPIError)
        session_id = (await rt.store.list_sessions())[0].id
        run_id = (await rt.store.list_runs(session_id))[0].id
        boundaries = await rt.store.list_boundaries(session_id=session_id)
        assert len(boundaries) >= 2
        await rt.rewind(session_id, run_id, _id(boundaries[0]))
    after = Checked(rounds=14)
    async with Runtime(db=db, model=after.model, agents=[agent]) as rt:
        result = await rt.resume(session_id)
    assert result.status == "done" and after.problems == [] and inner.problems == []
    # the restored context was over the threshold, so the resumed run compacts it first:
    # the summarizer sees the restored history itself (the raw task first, no summary)
    first = after.requests[0]
    assert is_summary_request(first)
    head = list(first.messages[:-1])
    assert head == contexts[0][: len(head)] and head[0].text == "Research SQLite"
    assert first.messages[-1].content[:-1] == contexts[0][len(head)].content


@pytest.mark.anyio
async def test_rewind_refuses_what_it_cannot_rewind(tmp_path: Path) -> None:
    agent = small_agent()
    async with Runtime(db=tmp_path / "r.db", model=Checked(rounds=10).model) as rt:
        result = await rt.run(agent, "Research SQLite")
        other = await rt.run(agent, "Another session")
        boundary = (await rt.store.list_boundaries(session_id=result.session_id))[0]
        failed_id = await rt.store.add_boundary(
            BoundaryRecord(
                run_id=result.run_id,
                kind="compaction",
                prefix="[]",
                ranges="[]",
                created=time.time(),
                status="failed",
                error="x",
            )
        )
        with pytest.raises(UserError, match="no boundary"):
            await rt.rewind(result.session_id, result.run_id, 99_999)
        with pytest.raises(UserError, match="no run"):
            await rt.rewind(other.session_id, result.run_id, _id(boundary))
        with pytest.raises(UserError, match="nothing to rewind"):
            await rt.rewind(result.session_id, result.run_id, failed_id)
        await rt.store.acquire_lease(result.session_id, "someone-else", 60.0)
        with pytest.raises(SessionBusyError):
            await rt.rewind(result.session_id, result.run_id, _id(boundary))


def _boundary(kind: str, status: str = "ok", **extra: Any) -> BoundaryRecord:
    return BoundaryRecord(
        run_id="r",
        kind=kind,
        prefix="[]",
        ranges="[]",
        created=0.0,
        status=status,
        extra=json.dumps(extra),
    )


def test_failures_count_until_a_success_or_a_rewind() -> None:
    ok, failed = _boundary("compaction"), _boundary("compaction", "failed")
    ineffective = _boundary("compaction", ineffective=True)
    assert consecutive_failures([failed, ok, failed, ineffective, _boundary("clear")]) == 2
    assert consecutive_failures([failed, failed, _boundary("rewind"), failed]) == 1
    assert not breaker_open([failed, failed])
    breaker, fallback = _boundary("breaker", "open"), _boundary("compaction", degraded=True)
    assert breaker_open([failed, breaker, fallback])
    assert not breaker_open([_boundary("breaker", "open"), _boundary("rewind")])
    # half-open after the cool-down; a success of the configured strategy closes it
    assert breaker_state([breaker, *[fallback] * (COOL_DOWN - 1)]) == "open"
    assert breaker_state([breaker, *[fallback] * COOL_DOWN]) == "half-open"
    assert breaker_state([breaker, *[fallback] * COOL_DOWN, ok]) == "closed"
    assert breaker_state([breaker, *[fallback] * COOL_DOWN, failed, breaker]) == "open"


# ------------------------------------------------------------------ CLI
def anabranch(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "anabranch", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )


def test_cli_lists_compactions_and_rewinds(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    agent = small_agent(max_compaction_failures=5)
    summaries = {"n": 0}
    inner = Checked(rounds=14)

    def second_summary_fails(request: ModelRequest) -> Any:
        if is_summary_request(request):
            summaries["n"] += 1
            if summaries["n"] == 2:
                return "<analysis>no summary</analysis>"
        return inner.model.function(request)

    async def make() -> tuple[str, str, list[BoundaryRecord]]:
        async with Runtime(db=db, model=FunctionModel(second_summary_fails)) as rt:
            result = await rt.run(agent, "Research SQLite")
            return (
                result.session_id,
                result.run_id,
                await rt.store.list_boundaries(session_id=result.session_id),
            )

    session_id, run_id, boundaries = anyio.run(make)
    listed = anabranch("compactions", session_id, "--db", str(db))
    assert listed.returncode == 0, listed.stderr
    lines = [line for line in listed.stdout.splitlines() if not line.startswith("      ")]
    assert "TRIGGER" in lines[0] and "STRATEGY" in lines[0] and "OUTCOME" in lines[0]
    assert len(lines) == 1 + len(boundaries)
    ok = boundaries[0]
    assert f"{ok.tokens_before}→{ok.tokens_after}" in lines[1]
    assert "worker" in lines[1] and "auto" in lines[1] and "summarize" in lines[1]
    assert lines[1].rstrip().endswith("ok")
    assert "failed: summarizer failed: test-model: the summarizer answered" in lines[2]

    rewound = anabranch("rewind", session_id, run_id, str(ok.id), "--db", str(db))
    assert rewound.returncode == 0, rewound.stderr
    assert f"rewound to before boundary #{ok.id}" in rewound.stdout
    # the run had finished: resume would return its result, so the command says so
    # (before: "continue from there with: anabranch resume ...", which then ran nothing)
    assert "continue from there" not in rewound.stdout
    assert "resume returns the finished result and runs nothing" in rewound.stdout
    relisted = anabranch("compactions", session_id, "--db", str(db))
    assert relisted.stdout.splitlines()[-1].rstrip().endswith(f"rewound to before #{ok.id}")

    bad = anabranch("rewind", session_id, run_id, "424242", "--db", str(db))
    assert bad.returncode == 1 and "no boundary 424242" in bad.stderr
    missing = anabranch("compactions", "ses_nope", "--db", str(db))
    assert missing.returncode == 1 and "no session" in missing.stderr
