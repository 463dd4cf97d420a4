"""``Runtime.send``: a session continues as a conversation in the root agent's context."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from anabranch import Agent, Runtime
from anabranch.errors import ModelAPIError, SessionNotFoundError, UserError
from anabranch.messages import ModelRequest
from anabranch.testing import FunctionModel, TestModel

from .compaction_helpers import FAST_RETRY, Checked, small_agent
from .helpers import failed_with

pytestmark = pytest.mark.anyio


def _echo(request: ModelRequest) -> object:
    users = [m.text for m in request.messages if m.role == "user" and m.text]
    return f"turn {len(users)}: {users[-1]}"


async def test_send_continues_the_root_agents_context(tmp_path: Path) -> None:
    model = FunctionModel(_echo)
    agent = Agent(name="chat", model="m")
    async with Runtime(db=tmp_path / "c.db", model=model) as rt:
        first = await rt.run(agent, "Plan the migration.")
        follow = await rt.send(first.session_id, "Now estimate the cost.")
        third = await rt.send(first.session_id, "And the risks?")
        runs = await rt.store.list_runs(first.session_id)
        session = await rt.store.get_session(first.session_id)
    assert follow.output == "turn 2: Now estimate the cost."
    assert third.output == "turn 3: And the risks?"
    assert follow.run_id == first.run_id == third.run_id and len(runs) == 1
    assert session is not None and session.status == "done" and session.output == third.output
    last = model.requests[-1]
    assert [m.role for m in last.messages] == ["user", "assistant"] * 2 + ["user"]
    assert last.messages[1].text == first.output  # what it answered before is in context
    assert third.usage.total_input_tokens > follow.usage.total_input_tokens


async def test_a_long_conversation_compacts_and_stays_valid(tmp_path: Path) -> None:
    checked = Checked(rounds=3)
    agent = small_agent("chatter")
    async with Runtime(db=tmp_path / "l.db", model=checked.model, retry=FAST_RETRY) as rt:
        result = await rt.run(agent, "Research tides")
        for topic in ("waves", "currents", "moons", "storms", "reefs"):
            result = await rt.send(result.session_id, f"Research {topic}")
            assert f"Report on: Research {topic}" in result.output
        boundaries = await rt.store.list_boundaries(session_id=result.session_id)
    assert checked.problems == []
    assert any(b.kind == "compaction" and b.status == "ok" for b in boundaries)
    for request in checked.main_requests():
        assert request.messages[-1].role == "user"


async def test_max_turns_counts_per_exchange(tmp_path: Path) -> None:
    agent = Agent(name="chat", model="m", max_turns=2, tools=small_agent().tools)
    async with Runtime(db=tmp_path / "t.db", model=TestModel(rounds=1)) as rt:
        result = await rt.run(agent, "first")
        for n in range(3):
            result = await rt.send(result.session_id, f"again {n}")
    assert result.status == "done" and not result.incomplete


async def test_an_interrupted_turn_resumes_and_then_the_conversation_goes_on(
    tmp_path: Path,
) -> None:
    fail = {"on": False}

    def answer(request: ModelRequest) -> object:
        if fail["on"]:
            raise ModelAPIError("bad gateway", status_code=400, error_type="invalid_request_error")
        return _echo(request)

    agent = Agent(name="chat", model="m")
    db = tmp_path / "r.db"
    async with Runtime(db=db, model=FunctionModel(answer)) as rt:
        first = await rt.run(agent, "one")
        fail["on"] = True
        failed_with(await rt.send(first.session_id, "two"), ModelAPIError)
        with pytest.raises(UserError, match="unfinished turn"):
            await rt.send(first.session_id, "three")
    fail["on"] = False
    async with Runtime(db=db, model=FunctionModel(answer), agents=[agent]) as rt:
        resumed = await rt.resume(first.session_id)
        assert resumed.output == "turn 2: two"  # the committed message was answered
        after = await rt.send(first.session_id, "three")
        assert after.output == "turn 3: three"


async def test_send_rejects_what_it_cannot_continue(tmp_path: Path) -> None:
    async with Runtime(db=tmp_path / "x.db", model=FunctionModel(_echo)) as rt:
        with pytest.raises(SessionNotFoundError):
            await rt.send("ses_missing", "hello")
        first = await rt.run(Agent(name="chat", model="m"), "one")
        for bad in ("", "   ", 42):
            with pytest.raises(UserError):
                await rt.send(first.session_id, bad)  # type: ignore[arg-type]
        with pytest.raises(UserError, match="not 'other'"):
            await rt.send(first.session_id, "hi", agent=Agent(name="other", model="m"))


async def test_stream_a_conversation_turn(tmp_path: Path) -> None:
    async with Runtime(db=tmp_path / "s.db", model=FunctionModel(_echo)) as rt:
        first = await rt.run(Agent(name="chat", model="m"), "one")
        with anyio.fail_after(20):
            async with rt.stream(session_id=first.session_id, message="two") as events:
                kinds = [e.kind async for e in events]
        assert events.result is not None and events.result.output == "turn 2: two"
    assert kinds[0] == "session_started" and kinds[-1] == "session_finished"
    assert "run_finished" in kinds
