"""Builders for compaction tests: small windows, checked models, store readers."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from anabranch import Agent, ContextPolicy, RetryPolicy, ToolContext, tool
from anabranch.context._pairing import pairing_violations
from anabranch.context._tokens import estimate_request
from anabranch.messages import Block, Message, ModelRequest
from anabranch.testing import FunctionModel, TestModel
from anabranch.testing._models import is_summary_request

FAST_RETRY = RetryPolicy(max_attempts=3, base_delay=0.0, max_delay=0.0)


@tool
def fetch(topic: str, ctx: ToolContext) -> str:
    """Fetch notes on a topic."""
    return f"notes for {topic} (call {ctx.call_id}): " + "lorem ipsum dolor sit amet " * 20


@tool
def huge(topic: str) -> str:
    """Return a very long document."""
    return "BEGIN " + "data " * 2000 + " END"


def small_policy(**overrides: Any) -> ContextPolicy:
    settings: dict[str, Any] = {
        "window": 1500,
        "compact_at": 0.7,
        "output_reserve": 200,
        "keep_recent": 4,
        "tool_result_max_chars": 800,
        "tool_result_preview_chars": 200,
        # the preventive note (~90 tokens of static prompt) is measured on its own; these
        # 1,500-token windows are sized for the compaction mechanics without it
        "preventive_notes": False,
    }
    settings.update(overrides)
    return ContextPolicy(**settings)


def small_agent(name: str = "worker", **policy: Any) -> Agent:
    return Agent(
        name=name,
        model="test-model",
        instructions="Research the topic with your tools, then report.",
        tools=[fetch],
        context=small_policy(**policy),
        max_turns=80,
    )


@dataclass
class Checked:
    """A FunctionModel over TestModel that checks every request the way the API would."""

    rounds: int = 12
    limit: int | None = None
    """Refuse main requests above this many tokens with 'prompt is too long'."""
    on_summary: Callable[[ModelRequest], Any] | None = None
    """Answer summary requests with this instead of TestModel's summary."""
    problems: list[str] = field(default_factory=list)
    model: FunctionModel = field(init=False)
    inner: TestModel = field(init=False)

    def __post_init__(self) -> None:
        self.inner = TestModel(rounds=self.rounds)
        self.model = FunctionModel(self._respond)

    def _respond(self, request: ModelRequest) -> list[Block]:
        from anabranch.errors import PromptTooLongError

        violations = pairing_violations(request.messages)
        if violations:
            self.problems.extend(violations)
        tokens = estimate_request(request)
        if self.limit is not None and tokens > self.limit:
            raise PromptTooLongError(f"prompt is too long: {tokens} tokens > {self.limit} maximum")
        if is_summary_request(request) and self.on_summary is not None:
            result = self.on_summary(request)
            return result if isinstance(result, list) else [_text(result)]
        return self.inner.respond(request)

    @property
    def requests(self) -> list[ModelRequest]:
        return self.model.requests

    def main_requests(self) -> list[ModelRequest]:
        return [r for r in self.requests if not is_summary_request(r)]

    def summary_requests(self) -> list[ModelRequest]:
        return [r for r in self.requests if is_summary_request(r)]


def _text(value: str) -> Block:
    from anabranch.messages import TextBlock

    return TextBlock(text=value)


def extra(boundary: Any) -> dict[str, Any]:
    return json.loads(boundary.extra) if boundary.extra else {}


def message(role: str, content: str) -> Message:
    return Message.model_validate({"role": role, "content": json.loads(content)})
