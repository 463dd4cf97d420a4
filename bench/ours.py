"""Driving anabranch for the benchmarks: an instant scripted model, the workload tool, chat turns.

anabranch has no multi-turn chat API yet (a run ends at the model's final answer). The
benchmarks hold a conversation the way such an API would: append the next user message to
the same run and drive it again. ``ChatStore`` drops the per-answer "run finished" row
that ``AgentRun.drive`` writes (alone, or with the answer's call), so a long conversation
stays one run; it is written once at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from anabranch import Agent, ContextPolicy, Message, ModelRequest, ModelResponse, Usage, tool
from anabranch.messages import TextBlock, ToolUseBlock
from anabranch.runtime._environment import Environment
from anabranch.runtime._loop import AgentRun, new_id
from anabranch.runtime._runtime import Runtime
from anabranch.store import SessionRecord, SQLiteStore
from bench.common import tool_result_for


@tool
async def lookup(query: str) -> str:
    """Look something up; returns about 2,000 characters."""
    return tool_result_for(query)


def bench_agent(max_turns: int = 1_000_000, *, name: str = "bench") -> Agent:
    return Agent(
        name=name,
        model="bench-model",
        instructions="You answer questions, using the lookup tool first.",
        tools=[lookup],
        max_turns=max_turns,
        # never compact in the persistence benchmark: its point is the raw per-turn cost
        context=ContextPolicy(window=1_000_000_000, output_reserve=4_096),
    )


class ScriptedModel:
    """Instant model: a tool call when the last message is the user's, else the reply.

    ``script(index)`` gives the (tool query, reply) of the ``index``-th user turn. Usage is
    a running chars/4 count kept incrementally (the model's cost is not ours to measure).
    """

    def __init__(self, script: Callable[[int], tuple[str, str]], latency: float = 0.0) -> None:
        self.script = script
        self.latency = latency
        self.calls = 0

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        if self.latency:
            import anyio

            await anyio.sleep(self.latency)
        last = request.messages[-1]
        index = _user_turn_index(request)
        query, reply = self.script(index)
        content: tuple[Any, ...]
        if last.tool_results:
            content = (TextBlock(text=reply),)
            stop = "end_turn"
        else:
            content = (ToolUseBlock(id=f"toolu_{index}", name="lookup", input={"query": query}),)
            stop = "tool_use"
        tokens = len(request.messages) * 180  # rough, O(1): not part of what is measured
        return ModelResponse(
            id=f"msg_{self.calls}",
            model=request.model,
            content=content,
            stop_reason=stop,
            usage=Usage(input_tokens=tokens, output_tokens=100),
        )


def _user_turn_index(request: ModelRequest) -> int:
    # Each turn is user, assistant(tool_use), user(tool_result), assistant(reply): the
    # index of the current user turn follows from the message count.
    return (len(request.messages) - 1) // 4


class ChatStore:
    """A view of the store that skips the run's end: ``finish_run``, and the end an
    answer's ``finish_call`` carries (see the module docstring)."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def finish_run(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def finish_call(self, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("run_output", None)  # an answer's run end goes with its call: dropped too
        await self._store.finish_call(*args, **kwargs)


async def new_session(rt: Runtime, agent: Agent, task: str) -> Environment:
    session_id = new_id("ses")
    await rt.store.create_session(
        SessionRecord(id=session_id, created=time.time(), kind="agent", entry=agent.name, task=task)
    )
    env = rt.environment(session_id)
    env.store = ChatStore(rt.store)  # type: ignore[assignment]
    return env


async def chat_turn(run: AgentRun, user: str) -> str:
    """Append the user's next message and drive the run to its answer."""
    await run.append(Message.user(user))
    return await run.drive()
