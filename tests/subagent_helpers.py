"""Shared helpers for the sub-agent and graph tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from anabranch.context._pairing import pairing_violations
from anabranch.messages import (
    Block,
    Message,
    ModelRequest,
    ToolResultBlock,
    ToolUseBlock,
    canonical_json,
)
from anabranch.runtime._history import load_messages
from anabranch.store import RunRecord, Store
from anabranch.testing import FunctionModel

from .helpers import wait_until

Handler = Callable[[ModelRequest], Any]


def routed(**handlers: Handler) -> FunctionModel:
    """A FunctionModel that answers each request with the handler named by its model."""

    async def answer(request: ModelRequest) -> Any:
        result = handlers[request.model.replace("-", "_")](request)
        if hasattr(result, "__await__"):
            result = await result
        return result

    return FunctionModel(answer)


def spawn(agent: str, task: str, mode: str = "fresh", call_id: str | None = None) -> ToolUseBlock:
    return ToolUseBlock(
        id=call_id or f"toolu_{agent}_{mode}",
        name="spawn_agent",
        input={"agent": agent, "task": task, "mode": mode},
    )


def use(name: str, call_id: str, **arguments: Any) -> ToolUseBlock:
    return ToolUseBlock(id=call_id, name=name, input=arguments)


def first_turn(request: ModelRequest) -> bool:
    """No assistant turn yet: the run is on its first call."""
    return not any(m.role == "assistant" for m in request.messages)


def results_of(request: ModelRequest) -> list[ToolResultBlock]:
    return [r for m in request.messages for r in m.tool_results]


def requests_for(model: FunctionModel, name: str) -> list[ModelRequest]:
    return [r for r in model.requests if r.model == name]


def text_of(request: ModelRequest) -> str:
    """Everything a request shows the model, as one string."""
    return canonical_json(request.model_dump(mode="json"))


def reply(*blocks: Block) -> list[Block]:
    return list(blocks)


async def run_messages(store: Store, run_id: str) -> list[Message]:
    """A run's stored messages as the run history reads them (tool results resolved)."""
    _, messages = await load_messages(store, run_id)
    return messages


async def runs_by_agent(store: Store, session_id: str) -> dict[str, list[RunRecord]]:
    grouped: dict[str, list[RunRecord]] = {}
    for run in await store.list_runs(session_id):
        grouped.setdefault(run.agent_name, []).append(run)
    return grouped


async def assert_store_consistent(store: Store, session_id: str) -> None:
    """Every committed context is valid for the API (an unanswered tool turn may end it);
    each tool call has at most one finished event, and every answered call has one."""
    for run in await store.list_runs(session_id):
        messages = await run_messages(store, run.id)
        problems = [
            p for p in pairing_violations(messages) if "ends with unanswered tool_use" not in p
        ]
        assert not problems, (run.agent_name, problems)
        calls = await store.list_calls(run.id)
        copied = calls[0].message_count if run.mode == "fork" and calls else 0
        for index, message in enumerate(messages):
            if index < copied or not message.tool_uses:
                continue
            ids = [u.id for u in message.tool_uses]
            events = await store.tool_events(run.id, ids)
            finished = Counter(e.call_id for e in events if e.event == "finished")
            assert all(n == 1 for n in finished.values()), (run.agent_name, finished)
            if index + 1 < len(messages):
                answered = {r.tool_use_id for r in messages[index + 1].tool_results}
                assert answered == set(ids)
                assert set(finished) == answered, (run.agent_name, finished, answered)


def overlaps(a: RunRecord, b: RunRecord) -> bool:
    """Whether two finished runs' lifetimes (created .. finished) intersect."""
    assert a.finished is not None and b.finished is not None
    return a.created < b.finished and b.created < a.finished


def names(items: Sequence[RunRecord]) -> list[str]:
    return [r.agent_name for r in items]


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    """Wait until ``check()`` is true, with a deadline (see ``helpers.wait_until``)."""
    await wait_until(check, interval=0.01)
