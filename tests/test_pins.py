"""Restore after compaction: pinned items come back after every compaction, and on resume.

Through the real SDK against the local server, in a small window, with a summarizer that
keeps nothing of what it is shown: a fact reaches a request after a compaction only if it
was pinned. ``plan`` is a ``@tool(pin=True)``; ``decide`` pins a decision with
``ToolContext.pin``; ``appendix`` pins a text over the caps, which is named with its recall
handle instead. The pinned block is in the user turn after the summary, never in the
system prompt.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from anabranch import Agent, AnthropicModel, Runtime, ToolContext, tool
from anabranch.context._compaction import is_compaction_message
from anabranch.errors import ModelAPIError
from anabranch.messages import ModelRequest, ToolUseBlock
from anabranch.runtime._pins import MAX_ITEMS, PINNED_TAG
from anabranch.testing import FunctionModel, MessagesServer
from anabranch.testing._models import is_summary_request

from .compaction_helpers import FAST_RETRY, fetch, small_policy

pytestmark = pytest.mark.anyio

FETCHES = 30
APPENDIX = "APPENDIX-9 " + "appendix line with many words in it " * 400


@tool(pin=True)
def plan(goal: str) -> str:
    """Write the plan for a goal."""
    return f"PLAN-42 for {goal}: survey, measure, report"


@tool
def decide(topic: str, ctx: ToolContext) -> str:
    """Decide how to proceed on a topic."""
    ctx.pin(f"decision DEC-7 on {topic}: use the median", label="decision on " + topic)
    return "decided"


@tool
def appendix(ctx: ToolContext) -> str:
    """Pin the long appendix."""
    ctx.pin(APPENDIX, label="the long appendix")
    return "appendix pinned"


@tool
def note(n: int, ctx: ToolContext) -> str:
    """Pin a small note."""
    ctx.pin(f"note NOTE-{n}", label=f"note {n}")
    return f"note {n} pinned"


def _script(extra_notes: int = 0) -> list[tuple[str, dict[str, Any]]]:
    steps: list[tuple[str, dict[str, Any]]] = [
        ("plan", {"goal": "latency"}),
        ("decide", {"topic": "outliers"}),
        ("appendix", {}),
    ]
    steps += [("note", {"n": n}) for n in range(extra_notes)]
    steps += [("fetch", {"topic": f"t{n}"}) for n in range(FETCHES)]
    return steps


class Policy:
    """Plays the script; the summarizer keeps nothing; optionally fails once after the
    first compacted request (the run stops there, to be resumed)."""

    def __init__(self, steps: list[tuple[str, dict[str, Any]]], *, fail_once: bool = False):
        self.steps = steps
        self.fail_once = fail_once
        self.failed_opening: str | None = None
        self.index = 0
        self.model = FunctionModel(self.answer)

    def answer(self, request: ModelRequest) -> Any:
        if is_summary_request(request):
            return "<summary>Work in progress.</summary>"
        first = request.messages[0]
        if self.fail_once and is_compaction_message(first) and self.failed_opening is None:
            self.failed_opening = first.text
            raise ModelAPIError("invalid request", status_code=400)
        if self.index >= len(self.steps):
            return "Done."
        name, arguments = self.steps[self.index]
        self.index += 1
        return [ToolUseBlock(id=f"toolu_{self.index:03d}", name=name, input=arguments)]


def _agent() -> Agent:
    return Agent(
        name="analyst",
        model="test-model",
        instructions="Analyse with your tools, then report.",
        tools=[plan, decide, appendix, note, fetch],
        context=small_policy(window=3_000, keep_recent=2),
        max_turns=60,
    )


def _main_requests(server: MessagesServer) -> list[ModelRequest]:
    return [
        r.request
        for r in server.log
        if r.status == 200 and r.request is not None and not is_summary_request(r.request)
    ]


def _assert_pins_in(request: ModelRequest) -> str:
    opening = request.messages[0]
    assert is_compaction_message(opening) and opening.role == "user"
    text = opening.text
    assert PINNED_TAG in text
    assert "PLAN-42 for latency" in text and "decision DEC-7 on outliers" in text
    # over the caps: named with its recall handle, not attached
    assert "APPENDIX-9" not in text
    assert re.search(r"the long appendix \(recall id=out_\w+\)", text)
    # the pins come after the summary, and never in the system prompt
    assert text.index("Work in progress.") < text.index(PINNED_TAG)
    assert all("PLAN-42" not in block.text for block in request.system)
    return text


async def test_pins_come_back_after_every_compaction(tmp_path: Path) -> None:
    policy = Policy(_script())
    with anyio.fail_after(120):
        async with MessagesServer(policy.model) as server:
            model = AnthropicModel(base_url=server.base_url, api_key="test")
            try:
                async with Runtime(db=tmp_path / "p.db", model=model, retry=FAST_RETRY) as rt:
                    result = await rt.run(_agent(), "Analyse the latency data")
                    boundaries = await rt.store.list_boundaries(session_id=result.session_id)
                    appendix_handle = re.findall(
                        r"the long appendix \(recall id=(out_\w+)\)",
                        "".join(m.text for m in _main_requests(server)[-1].messages[:1]),
                    )
                    spill = await rt.store.get_spill(appendix_handle[0])
            finally:
                await model.aclose()
    assert result.status == "done", result.error
    compactions = [b for b in boundaries if b.kind == "compaction" and b.status == "ok"]
    assert len(compactions) >= 2, "the scenario compacts more than once"
    compacted = [r for r in _main_requests(server) if is_compaction_message(r.messages[0])]
    assert compacted
    for request in compacted:
        _assert_pins_in(request)
    # the system prompt is the same before and after every compaction (prefix-stable)
    systems = {tuple(b.text for b in r.system) for r in _main_requests(server)}
    assert len(systems) == 1
    assert spill == APPENDIX, "the over-cap pin is recallable in full"
    assert [b.kind for b in boundaries].count("pin") == 3


async def test_at_most_the_latest_pins_are_attached(tmp_path: Path) -> None:
    policy = Policy(_script(extra_notes=MAX_ITEMS + 1))
    with anyio.fail_after(120):
        async with MessagesServer(policy.model) as server:
            model = AnthropicModel(base_url=server.base_url, api_key="test")
            try:
                async with Runtime(db=tmp_path / "n.db", model=model, retry=FAST_RETRY) as rt:
                    result = await rt.run(_agent(), "Analyse the latency data")
            finally:
                await model.aclose()
    assert result.status == "done", result.error
    last = next(r for r in reversed(_main_requests(server)) if is_compaction_message(r.messages[0]))
    text = last.messages[0].text
    attached = re.findall(r"<pin label=", text)
    assert len(attached) == MAX_ITEMS
    # the latest notes are attached, the earlier pins are named with their handles
    assert all(f"note NOTE-{n}" in text for n in range(1, MAX_ITEMS + 1))
    assert "note NOTE-0" not in text and "PLAN-42" not in text
    for label in ("note 0", "plan result", "decision on outliers", "the long appendix"):
        assert re.search(re.escape(label) + r" \(recall id=out_\w+\)", text), label


async def test_a_resumed_run_gets_the_same_pins_back(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    policy = Policy(_script(), fail_once=True)
    with anyio.fail_after(120):
        async with MessagesServer(policy.model) as server:
            model = AnthropicModel(base_url=server.base_url, api_key="test")
            try:
                async with Runtime(db=db, model=model, retry=FAST_RETRY) as rt:
                    stopped = await rt.run(_agent(), "Analyse the latency data")
                assert stopped.status == "failed" and policy.failed_opening is not None
                before = len(server.log)
                async with Runtime(db=db, model=model, retry=FAST_RETRY, agents=[_agent()]) as rt:
                    resumed = await rt.resume(stopped.session_id)
            finally:
                await model.aclose()
    assert resumed.status == "done", resumed.error
    after = [
        r.request
        for r in server.log[before:]
        if r.status == 200 and r.request is not None and not is_summary_request(r.request)
    ]
    # the first request after resume opens with the very context the stopped run had
    assert after[0].messages[0].text == policy.failed_opening
    _assert_pins_in(after[0])
    # and compactions after the resume still restore the pins
    later = [r for r in after[1:] if is_compaction_message(r.messages[0])]
    assert any(r.messages[0].text != policy.failed_opening for r in later)
    for request in later:
        _assert_pins_in(request)
