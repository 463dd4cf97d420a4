"""Shared helpers for the prompt-cache tests: a tool loop, a fake clock, scripted pipeline."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from types import SimpleNamespace

import pytest

from anabranch import Agent, tool
from anabranch.messages import (
    Message,
    ModelRequest,
    ModelResponse,
    TextBlock,
    ToolUseBlock,
    Usage,
    messages_to_json,
)
from anabranch.runtime._context_view import BoundaryCommit, ContextChange, ContextView
from anabranch.runtime._loop import AgentRun
from anabranch.runtime._pipeline import PassThroughPipeline
from anabranch.store import BoundaryRecord
from anabranch.testing import FunctionModel

Action = Callable[[AgentRun], Awaitable[ContextChange | None]]


@tool
def probe(n: int) -> str:
    """Return a short observation for step n."""
    return f"observation {n}"


def agent(**fields: object) -> Agent:
    defaults: dict[str, object] = {
        "name": "worker",
        "model": "claude-sonnet-5-5",
        "instructions": "Investigate with probe, then report.",
        "tools": [probe],
    }
    defaults.update(fields)
    return Agent(**defaults)


def tool_loop(
    tool_turns: int, usages: Sequence[Usage] = (), *, calls_per_turn: int = 1
) -> FunctionModel:
    """Calls ``probe`` for ``tool_turns`` turns, then answers; call i gets ``usages[i]``."""

    def respond(request: ModelRequest) -> ModelResponse:
        index = len(model.requests) - 1
        done = sum(1 for m in request.messages if m.role == "assistant")
        stamp = request.fingerprint()[:16]  # unique per request, the same when resent
        content: tuple[TextBlock | ToolUseBlock, ...]
        if done < tool_turns:
            content = tuple(
                ToolUseBlock(id=f"toolu_{stamp}_{i}", name="probe", input={"n": done})
                for i in range(calls_per_turn)
            )
        else:
            content = (TextBlock(text="final report"),)
        return ModelResponse(
            id=f"msg_{index}",
            model=request.model,
            content=content,
            stop_reason="tool_use" if done < tool_turns else "end_turn",
            usage=usages[index] if index < len(usages) else Usage(input_tokens=10),
        )

    model = FunctionModel(respond)
    return model


class FakeClock:
    """Replaces the agent loop's wall clock so idle time can be simulated."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = time.time()
        clock = SimpleNamespace(time=self)
        monkeypatch.setattr("anabranch.runtime._loop.time", clock)
        monkeypatch.setattr("anabranch.runtime._model_calls.time", clock)  # the call rows'

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ScriptedPipeline(PassThroughPipeline):
    """Runs ``actions[n]`` before the n-th model call of a run (n counts from 1).

    An action stands for what happens between two calls (the definition edited, time
    passing) and may return a ``ContextChange`` for the loop to commit (a compaction).
    """

    def __init__(self, actions: dict[int, Action]) -> None:
        self.actions = actions

    async def before_call(self, run: ContextView) -> ContextChange | None:
        assert isinstance(run, AgentRun), "the loop hands its own run as the view"
        action = self.actions.pop(run.turns + 1, None)
        return None if action is None else await action(run)


async def compact(run: AgentRun) -> ContextChange:
    """A minimal compaction as the compaction feature does it: a boundary whose context
    keeps the last assistant/user pair after a summary message; the loop commits it and
    rebuilds the snapshot.
    """
    kept = run.context[-2:]
    summary = Message.user("<summary>Earlier steps were summarized.</summary>")
    first_kept = run.next_seq - len(kept)
    boundary = BoundaryRecord(
        run_id=run.id,
        kind="compaction",
        prefix=messages_to_json([summary]),
        ranges=json.dumps([[first_kept, None]]),
        created=time.time(),
        strategy="window",
    )
    commit = BoundaryCommit(boundary, context=(summary, *kept), next_seq=run.next_seq)
    return ContextChange(commits=(commit,), rebuild_prompt=True)
