"""The no-silent-loss invariant, property-tested on random histories against a real store.

Content leaves an agent's context only (a) after a summarizer request contained it, or
(b) in an explicit note naming its recall handle. Here the summarizer keeps *nothing*
("<summary>ok</summary>"), so any unit of content that is neither in a summarizer request
nor reachable by a handle the new context names would be lost for good.
"""

from __future__ import annotations

import itertools
import re
import tempfile
from functools import partial
from pathlib import Path

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anabranch import Agent, ContextPolicy, Runtime
from anabranch.context._budget import clear_tool_results
from anabranch.context._digest import named_seqs
from anabranch.context._transcript import render_message
from anabranch.messages import (
    Block,
    Message,
    ModelRequest,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from anabranch.runtime._loop import AgentRun
from anabranch.testing import FunctionModel
from anabranch.testing._models import is_summary_request

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
_HANDLE = re.compile(r"recall id=(out_\w+)")
_WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma")


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    """A valid context ending on a user turn; every block carries a unique token ``uN``."""
    tokens = itertools.count()

    def body(size: int) -> str:
        words = [_WORDS[i % len(_WORDS)] for i in range(size)]
        return f"u{next(tokens)}x " + " ".join(words)

    messages = [Message.user(body(draw(st.integers(1, 40))))]
    call_ids = itertools.count()
    for _ in range(draw(st.integers(1, 12))):
        if draw(st.booleans()):
            uses = [
                ToolUseBlock(id=f"toolu_{next(call_ids)}", name="lookup", input={"q": body(2)})
                for _ in range(draw(st.integers(1, 3)))
            ]
            messages.append(Message(role="assistant", content=tuple(uses)))
            results: list[Block] = [
                ToolResultBlock(tool_use_id=u.id, content=body(draw(st.integers(1, 900))))
                for u in uses
            ]
            messages.append(Message(role="user", content=tuple(results)))
        else:
            messages.append(Message(role="assistant", content=(TextBlock(text=body(20)),)))
            messages.append(Message.user(body(draw(st.integers(1, 60)))))
    return messages


def _units(messages: list[Message]) -> list[tuple[int, str]]:
    """(seq, token) of every block of the original context."""
    out: list[tuple[int, str]] = []
    for seq, message in enumerate(messages):
        for block in message.content:
            text = render_message(Message(role=message.role, content=(block,)))
            out.extend((seq, token) for token in re.findall(r"\bu\d+x\b", text))
    return out


def _text(messages: list[Message] | tuple[Message, ...]) -> str:
    return "\n".join(render_message(m) for m in messages)


async def _check(
    tmp: Path, history: list[Message], strategy: str, window: int, level: int, clear: bool
) -> None:
    summaries: list[ModelRequest] = []

    def model(request: ModelRequest) -> str:
        assert is_summary_request(request)
        summaries.append(request)
        return "<summary>ok</summary>"

    policy = ContextPolicy(
        window=window,
        strategy=strategy,
        output_reserve=window // 8,
        keep_recent=2,
    )
    agent = Agent(name="worker", model="m", instructions="Work.", context=policy)
    async with Runtime(db=tmp / "r.db", model=FunctionModel(model)) as rt:
        session = await rt.open_session(
            kind="agent", entry="worker", task="t", source=None, outline={}, on_session=None
        )
        env = rt.environment(session)
        run = await AgentRun.start(env, agent, history)
        if clear:  # some results already stubbed (and spilled) by an earlier clearing
            stubbed, spills = clear_tool_results(history, keep_last=1, run_id=run.id)
            for spill in spills:
                await rt.store.save_spill(spill.handle, run.id, spill.call_id, spill.content)
            run.context = list(stubbed)
        before = list(run.context)
        compact = partial(env.pipeline.compact, trigger="manual", level=level)  # type: ignore[attr-defined]
        outcome = await run.pipeline_step(compact)
        after = list(run.context)
        if not outcome.applied:
            assert after == before
            return
        kept = _text(after)
        named = set(named_seqs(kept))
        handles = set(_HANDLE.findall(kept))
        spilled = {}
        for handle in handles:
            record = await rt.store.get_spill_record(handle)
            if record is not None:
                spilled[handle] = record.content
        sent = "\n".join(_text(r.messages) for r in summaries)
        for seq, token in _units(history):
            if re.search(rf"\b{token}\b", kept):
                continue  # still in view
            # a stub (from clearing) names its output's handle: that is an explicit note
            by_spill = any(re.search(rf"\b{token}\b", c) for c in spilled.values())
            if strategy == "summarize":
                seen = by_spill or re.search(rf"\b{token}\b", sent)
                assert seen, f"{token} (msg-{seq}) never summarized"
            else:
                assert seq in named or by_spill, f"{token} (msg-{seq}) dropped silently"


@PROPERTY
@given(
    histories(),
    st.sampled_from(["summarize", "window", "verbatim"]),
    st.integers(1_500, 9_000),
    st.integers(0, 3),
    st.booleans(),
)
def test_nothing_leaves_a_context_unseen_or_unnamed(
    history: list[Message],
    strategy: str,
    window: int,
    level: int,
    clear: bool,
) -> None:
    async def bounded(folder: Path) -> None:
        with anyio.fail_after(60):
            await _check(folder, history, strategy, window, level, clear)

    with tempfile.TemporaryDirectory() as folder:
        anyio.run(bounded, Path(folder))
