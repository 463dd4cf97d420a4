"""What the runtime sends: breakpoints per request, deterministic tools, shared prefixes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from anabranch import Agent, ContextPolicy, Runtime, tool
from anabranch.context._cache import MAX_BREAKPOINTS
from anabranch.context._prompt import DYNAMIC_BOUNDARY
from anabranch.messages import ToolDefinition, ToolUseBlock
from anabranch.models._anthropic import request_to_params
from anabranch.runtime._builtins import ToolOutcome
from anabranch.runtime._loop import AgentRun
from anabranch.runtime._view import RunView

from ._cache_support import agent, probe, tool_loop

pytestmark = pytest.mark.anyio


@tool
def alpha(text: str, limit: int = 3) -> str:
    """First tool."""
    return text[:limit]


async def test_every_request_has_at_most_four_breakpoints_where_stated(tmp_path: Path) -> None:
    worker = agent(
        instructions=f"Static rules.\n{DYNAMIC_BOUNDARY}\nToday's focus: caching.",
        tools=[probe, alpha],
    )
    model = tool_loop(3)
    async with Runtime(db=tmp_path / "a.db", model=model) as rt:
        await rt.run(worker, "task")
    for request in model.requests:
        assert request.breakpoint_count() == MAX_BREAKPOINTS
        assert [b.cache for b in request.system] == ["5m", "5m"]
        assert [t.name for t in request.tools] == ["alpha", "probe", "recall"]
        assert [t.cache for t in request.tools] == [None, None, "5m"]
        assert request.message_breakpoints == ((len(request.messages) - 1, "5m"),)
        wire = request_to_params(request)
        marks = sum(
            1
            for part in (wire.get("tools", []), wire.get("system", []))
            for item in part
            if "cache_control" in item
        ) + sum(1 for m in wire["messages"] for block in m["content"] if "cache_control" in block)
        assert marks == request.breakpoint_count()


async def test_long_tool_turn_keeps_the_previous_entry_reachable(tmp_path: Path) -> None:
    model = tool_loop(2, calls_per_turn=12)
    async with Runtime(db=tmp_path / "a.db", model=model) as rt:
        await rt.run(agent(), "task")
    second = model.requests[1]  # [task, 12 tool_use, 12 tool_result]: 24 blocks after the task
    assert second.breakpoint_count() <= MAX_BREAKPOINTS
    assert second.message_breakpoints == ((0, "5m"), (2, "5m"))
    assert second.system[0].cache == "5m"


async def test_ttl_policy_reaches_the_wire(tmp_path: Path) -> None:
    worker = agent(context=ContextPolicy(cache_ttl="5m", prefix_cache_ttl="1h"))
    model = tool_loop(1)
    async with Runtime(db=tmp_path / "a.db", model=model) as rt:
        await rt.run(worker, "task")
    wire = request_to_params(model.requests[-1])
    assert wire["tools"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert wire["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert wire["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}


async def test_breakpoints_can_be_turned_off(tmp_path: Path) -> None:
    model = tool_loop(1)
    async with Runtime(db=tmp_path / "a.db", model=model) as rt:
        await rt.run(agent(context=ContextPolicy(cache_breakpoints=False)), "task")
    assert all(r.breakpoint_count() == 0 for r in model.requests)


async def test_tool_list_is_sorted_and_serialized_deterministically(tmp_path: Path) -> None:
    bodies: list[str] = []
    for order in ([probe, alpha], [alpha, probe]):
        model = tool_loop(1)
        async with Runtime(db=tmp_path / f"{len(bodies)}.db", model=model) as rt:
            await rt.run(agent(tools=order), "task")
        bodies.append(json.dumps(request_to_params(model.requests[0])))
    assert bodies[0] == bodies[1]
    assert [t["name"] for t in json.loads(bodies[0])["tools"]] == ["alpha", "probe", "recall"]


async def test_sibling_subagents_share_one_static_prefix(tmp_path: Path) -> None:
    child = agent(name="researcher", instructions=f"Research.\n{DYNAMIC_BOUNDARY}\n")
    parent = Agent(name="lead", instructions="Delegate.", subagents=[child])
    model = tool_loop(0)
    async with Runtime(db=tmp_path / "a.db", model=model) as rt:
        result = await rt.run(parent, "task")
        env = rt.environment(result.session_id)
        siblings = [
            await AgentRun.start(
                env, child, f"sub-task {i}", parent_run_id=result.run_id, depth=1, mode="fresh"
            )
            for i in range(2)
        ]
        requests = [run.build_request() for run in siblings]
    first, second = requests
    assert first.tools == second.tools
    assert first.system == second.system
    assert "report for the agent that delegated" in first.system[0].text
    assert first.messages != second.messages


async def test_forked_run_copies_the_parent_prefix(tmp_path: Path) -> None:
    model = tool_loop(2)
    async with Runtime(db=tmp_path / "a.db", model=model) as rt:
        result = await rt.run(agent(), "task")
        env = rt.environment(result.session_id)
        runs = await rt.store.list_runs(result.session_id)
        parent = await AgentRun.load(env, agent(), runs[0])
        fork = await AgentRun.start(
            env,
            agent(),
            [*parent.context[:-1]],
            parent_run_id=parent.id,
            depth=1,
            mode="fork",
            snapshot=(parent.system, parent.tools),
        )
        parent_request = model.requests[-1]
        fork_request = fork.build_request()
    assert fork_request.system == parent_request.system
    assert fork_request.tools == parent_request.tools
    assert fork_request.model == parent_request.model
    assert fork_request.messages == parent_request.messages


class _GuidedTool:
    """A built-in tool that offers guidance for the static system block."""

    name = "notes"

    def applies_to(self, agent: Agent) -> bool:
        return True

    def definition(self, agent: Agent) -> ToolDefinition:
        return ToolDefinition(name="notes", description="Notes.", input_schema={"type": "object"})

    def guidance(self, agent: Agent) -> str:
        return "Use the notes tool to keep track of findings."

    async def run(self, run: RunView, call: ToolUseBlock) -> ToolOutcome:
        return ToolOutcome("noted")


async def test_builtin_tool_guidance_joins_the_static_block(tmp_path: Path) -> None:
    worker = agent(instructions=f"Rules.\n{DYNAMIC_BOUNDARY}\nVolatile.")
    model = tool_loop(0)
    async with Runtime(db=tmp_path / "a.db", model=model, builtins=[_GuidedTool()]) as rt:
        await rt.run(worker, "task")
    static, dynamic = (b.text for b in model.requests[0].system)
    assert static == "Rules.\n\nUse the notes tool to keep track of findings."
    assert dynamic == "Volatile."
    assert [t.name for t in model.requests[0].tools] == ["notes", "probe"]
