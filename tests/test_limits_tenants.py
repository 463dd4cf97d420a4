"""Budgets kept in the store: a tenant's daily budget across processes, and a session
stopped by its budget continued with a new one."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from anabranch import Agent, AnthropicModel, Budget, RetryPolicy, Runtime, tool
from anabranch.errors import BudgetExceeded
from anabranch.messages import ModelRequest, TextBlock
from anabranch.testing import FunctionModel, MessagesServer

from .subagent_helpers import results_of, use

pytestmark = pytest.mark.anyio

DAILY = 20_000
WORKER = textwrap.dedent(
    f"""
    import json, sys
    import anyio
    from anabranch import Agent, AnthropicModel, Budget, RetryPolicy, Runtime, tool

    @tool
    def lookup(topic: str) -> str:
        \"\"\"Look one thing up.\"\"\"
        return f"{{topic}}: found FACT-{{topic}}"

    agent = Agent(name="worker", model="worker", tools=[lookup], max_turns=500)

    async def main() -> None:
        model = AnthropicModel(base_url=sys.argv[2], api_key="test")
        budgets = {{"acme": Budget(max_tokens={DAILY}, per="day")}}
        retry = RetryPolicy(max_attempts=2, base_delay=0.0, max_delay=0.0)
        async with Runtime(db=sys.argv[1], model=model, budgets=budgets, retry=retry) as rt:
            result = await rt.run(agent, sys.argv[3], tenant="acme")
        await model.aclose()
        print(json.dumps({{"incomplete": result.incomplete, "stop": result.stop_reason,
                          "output": result.output, "session": result.session_id}}))

    anyio.run(main)
    """
)


def endless(request: ModelRequest) -> object:
    """Looks one more thing up every turn; told to stop, reports what it found."""
    if request.settings.tool_choice == "none":
        return "Report: " + " ".join(r.content for r in results_of(request))
    turn = sum(1 for m in request.messages if m.role == "assistant")
    return [TextBlock(text="next"), use("lookup", f"toolu_w{turn}", topic=f"t{turn}")]


async def test_a_tenants_daily_budget_holds_across_two_processes(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    db = tmp_path / "shared.db"
    async with MessagesServer(FunctionModel(endless)) as srv:
        # create the database first, so the two processes never race to migrate it
        async with Runtime(db=db):
            pass
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
        outputs: dict[str, str] = {}

        async def work(name: str) -> None:
            command = [sys.executable, str(script), str(db), srv.base_url, f"task {name}"]
            result = await anyio.run_process(command, env=env, check=False)
            assert result.returncode == 0, result.stderr.decode()
            outputs[name] = result.stdout.decode()

        with anyio.fail_after(180):
            async with anyio.create_task_group() as group:
                group.start_soon(work, "one")
                group.start_soon(work, "two")
        budgets = {"acme": Budget(max_tokens=DAILY, per="day")}
        async with Runtime(db=db, model=FunctionModel(endless), budgets=budgets) as rt:
            spent = await rt.store.tenant_spend("acme", 0.0)
            sessions = {
                name: json.loads(out.strip().splitlines()[-1]) for name, out in outputs.items()
            }
            per_session = [await rt.session_usage(s["session"]) for s in sessions.values()]
            with pytest.raises(BudgetExceeded, match="the budget of acme is used up"):
                await rt.run(Agent(name="worker", model="worker"), "a third", tenant="acme")
    for result in sessions.values():
        assert result["incomplete"] and result["stop"] == "budget"
        assert "FACT-t" in result["output"]
    tokens = [u.total_input_tokens + u.output_tokens for u in per_session]
    assert spent.tokens == sum(tokens)
    # one budget for both: with a budget per process each would stop near the whole of it
    # on its own (together ~2x); shared through the store, together they stay within it
    assert spent.tokens <= DAILY * 1.05, (spent.tokens, tokens)


async def test_a_session_stopped_by_its_budget_continues_with_a_new_one(tmp_path: Path) -> None:
    @tool
    def lookup(topic: str) -> str:
        """Look one thing up."""
        return f"{topic}: found FACT-{topic}"

    worker = Agent(name="worker", model="worker", tools=[lookup], max_turns=500)
    async with MessagesServer(FunctionModel(endless)) as srv:
        model = AnthropicModel(base_url=srv.base_url, api_key="test")
        retry = RetryPolicy(max_attempts=2, base_delay=0.0, max_delay=0.0)
        try:
            async with Runtime(db=tmp_path / "c.db", model=model, retry=retry) as rt:
                first = await rt.run(worker, "dig", budget=Budget(max_tokens=5_000))
                again = await rt.resume(first.session_id)  # same budget: nothing to do
                more = await rt.resume(first.session_id, budget=Budget(max_tokens=15_000))
                stored = await rt.store.session_budget(first.session_id)
                session = await rt.store.get_session(first.session_id)
        finally:
            await model.aclose()
    assert first.incomplete and first.stop_reason == "budget"
    assert again.output == first.output and again.incomplete
    assert more.incomplete and more.stop_reason == "budget"
    first_tokens = first.usage.total_input_tokens + first.usage.output_tokens
    more_tokens = more.usage.total_input_tokens + more.usage.output_tokens
    assert first_tokens <= 5_000 < more_tokens <= 15_000 * 1.05
    continued = [
        r.request
        for r in srv.log
        if r.request is not None and "[limit raised]" in r.request.messages[-1].text
    ]
    assert len(continued) == 1 and "15,000 tokens" in continued[0].messages[-1].text
    assert continued[0].settings.tool_choice is None  # tools again
    assert stored is not None and stored.budget is not None and "15000" in stored.budget
    assert session is not None and session.status == "incomplete"
