"""Tool approval: a run pauses durably on ``@tool(needs_approval=...)`` until answered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from anabranch import Agent, RunResult, Runtime, tool
from anabranch.errors import ApprovalPendingError, ToolDefinitionError, UserError
from anabranch.messages import ModelRequest, ToolResultBlock
from anabranch.testing import FunctionModel

from .subagent_helpers import first_turn, results_of, routed, spawn, use

pytestmark = pytest.mark.anyio

RAN: list[str] = []


@tool(needs_approval=True)
def delete_table(table: str) -> str:
    """Drop a table."""
    RAN.append(table)
    return f"dropped {table}"


@tool(needs_approval=lambda args: args.get("amount", 0) > 100)
def pay(amount: int) -> str:
    """Pay an amount."""
    RAN.append(f"pay {amount}")
    return f"paid {amount}"


@tool
def look(topic: str) -> str:
    """Look something up."""
    RAN.append(f"look {topic}")
    return f"notes on {topic}"


def _script(*calls: Any) -> FunctionModel:
    def answer(request: ModelRequest) -> object:
        if first_turn(request):
            return list(calls)
        results = results_of(request)
        return "final: " + " | ".join(
            f"{'ERR' if r.is_error else 'ok'} {r.content}" for r in results
        )

    return FunctionModel(answer)


def waiting(result: RunResult) -> ApprovalPendingError:
    """The session paused for approval: ``raise_for_status()`` names the waiting calls."""
    assert result.status == "waiting", (result.status, result.error)
    with pytest.raises(ApprovalPendingError) as raised:
        result.raise_for_status()
    assert raised.value.session_id == result.session_id
    return raised.value


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


async def test_a_call_waits_for_approval_across_processes(tmp_path: Path) -> None:
    agent = Agent(name="dba", model="m", tools=[delete_table, look])
    calls = (use("delete_table", "toolu_del", table="users"), use("look", "toolu_look", topic="x"))
    db = tmp_path / "a.db"
    seen: list[Any] = []
    async with Runtime(db=db, model=_script(*calls), on_event=seen.append) as rt:
        pending = waiting(await rt.run(agent, "clean up"))
        session_id = pending.session_id
        assert session_id is not None
        assert [c[1:] for c in pending.calls] == [("toolu_del", "delete_table")]
        listed = await rt.pending_approvals(session_id)
        session = await rt.store.get_session(session_id)
    assert RAN == ["look x"]  # the other call of the turn ran; the gated one did not
    assert [(p.call_id, p.tool, p.arguments) for p in listed] == [
        ("toolu_del", "delete_table", {"table": "users"})
    ]
    assert session is not None and session.status == "waiting"
    requested = [e for e in seen if e.kind == "approval_requested"]
    assert [(e.call_id, e.tool) for e in requested] == [("toolu_del", "delete_table")]
    assert seen[-1].kind == "session_finished" and seen[-1].status == "waiting"
    # a new process answers, a third resumes
    async with Runtime(db=db, model=_script(*calls)) as rt:
        await rt.approve(session_id, "toolu_del")
        with pytest.raises(UserError, match="no tool call"):
            await rt.approve(session_id, "toolu_del")  # already answered
    async with Runtime(db=db, model=_script(*calls), agents=[agent]) as rt:
        result = await rt.resume(session_id)
    assert RAN == ["look x", "users"]  # nothing ran twice
    assert result.status == "done"
    assert result.output == "final: ok dropped users | ok notes on x"


async def test_a_denial_reaches_the_model_as_an_error_with_the_reason(tmp_path: Path) -> None:
    agent = Agent(name="dba", model="m", tools=[delete_table])
    model = _script(use("delete_table", "toolu_del", table="orders"))
    async with Runtime(db=tmp_path / "d.db", model=model, agents=[agent]) as rt:
        session_id = waiting(await rt.run(agent, "clean up")).session_id
        assert session_id is not None
        await rt.approve(session_id, "toolu_del", deny="orders is production data")
        result = await rt.resume(session_id)
    assert RAN == []
    last = model.requests[-1]
    denied = [b for m in last.messages for b in m.content if isinstance(b, ToolResultBlock)]
    assert len(denied) == 1 and denied[0].is_error
    assert "orders is production data" in denied[0].content
    assert result.output.startswith("final: ERR The user denied this tool call")


async def test_a_predicate_decides_per_call(tmp_path: Path) -> None:
    agent = Agent(name="payer", model="m", tools=[pay])
    calls = (use("pay", "toolu_small", amount=5), use("pay", "toolu_big", amount=500))
    async with Runtime(db=tmp_path / "p.db", model=_script(*calls), agents=[agent]) as rt:
        pending = waiting(await rt.run(agent, "pay both"))
        assert [c[1] for c in pending.calls] == ["toolu_big"]
        assert RAN == ["pay 5"]
        session_id = pending.session_id
        assert session_id is not None
        await rt.approve(session_id, "toolu_big")
        result = await rt.resume(session_id)
    assert RAN == ["pay 5", "pay 500"]
    assert result.output == "final: ok paid 5 | ok paid 500"


async def test_a_sub_agents_approval_pauses_the_session_and_its_sibling_finishes(
    tmp_path: Path,
) -> None:
    def boss(request: ModelRequest) -> object:
        if first_turn(request):
            return [
                spawn("dba", "drop t", call_id="toolu_s1"),
                spawn("reader", "read", call_id="toolu_s2"),
            ]
        return "boss: " + " | ".join(r.content.splitlines()[-1] for r in results_of(request))

    def dba(request: ModelRequest) -> object:
        if first_turn(request):
            return [use("delete_table", "toolu_child_del", table="t")]
        return "dba " + results_of(request)[0].content

    def reader(request: ModelRequest) -> object:
        if first_turn(request):
            return [use("look", "toolu_child_look", topic="y")]
        return "reader " + results_of(request)[0].content

    model = routed(boss=boss, dba=dba, reader=reader)
    supervisor = Agent(
        name="boss",
        model="boss",
        subagents=[
            Agent(name="dba", model="dba", tools=[delete_table]),
            Agent(name="reader", model="reader", tools=[look]),
        ],
    )
    async with Runtime(db=tmp_path / "s.db", model=model, agents=[supervisor]) as rt:
        with anyio.fail_after(30):
            session_id = waiting(await rt.run(supervisor, "go")).session_id
        assert session_id is not None
        runs = {r.agent_name: r for r in await rt.store.list_runs(session_id)}
        assert runs["reader"].status == "done" and runs["dba"].status == "running"
        await rt.approve(session_id, "toolu_child_del")
        result = await rt.resume(session_id)
    assert RAN == ["look y", "t"]
    assert result.output == "boss: dba dropped t | reader notes on y"


async def test_approve_validates_its_input(tmp_path: Path) -> None:
    async with Runtime(db=tmp_path / "v.db", model=_script()) as rt:
        with pytest.raises(UserError):
            await rt.approve("ses_missing", "toolu_x")
    with pytest.raises(ToolDefinitionError):
        not_a_decision: Any = "yes"

        @tool(needs_approval=not_a_decision)
        def bad() -> str:
            """Bad."""
            return ""
