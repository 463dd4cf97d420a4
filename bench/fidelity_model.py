"""The fidelity benchmark's scenarios and its perfect model (see ``bench/fidelity.py``).

The policy answers like an ideal agent: a worker calls its tool ``calls`` times (following
truncated outputs page by page with ``recall``), then reports every fact token it can see;
a manager spawns its sub-agents, then reports every fact token it can see; a summarizer
keeps every fact token it is shown. Each request gets one answer (a request sent again
after a crash gets the same one).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass

from anabranch import Agent, ContextPolicy, tool
from anabranch.context._tokens import estimate_messages, estimate_request
from anabranch.errors import ModelConnectionError, PromptTooLongError
from anabranch.messages import (
    Block,
    Message,
    ModelRequest,
    ModelResponse,
    TextBlock,
    ToolUseBlock,
    Usage,
)
from anabranch.testing._models import is_summary_request
from bench.common import text as prose

FACT = re.compile(r"\bfct[0-9a-f]{10}\b")
ROLE = re.compile(r"ROLE=(\w+)\.")
PAGE = re.compile(r"recall id=(out_\w+) offset=(\d+)\]")
_TRUNCATED = re.compile(
    r"showing the first ([\d,]+) of [\d,]+ characters; full output: recall id=(out_\w+)\]"
)


def fact_token(role: str, index: int, part: int = 0) -> str:
    return "fct" + hashlib.sha256(f"{role}:{index}:{part}".encode()).hexdigest()[:10]


# ---------------------------------------------------------------------------- scenarios
@dataclass(frozen=True)
class Role:
    name: str
    window: int
    children: tuple[str, ...] = ()
    calls: int = 0
    result_chars: int = 2_000
    facts_per_result: int = 1
    limit: int | None = None
    """The API's real limit for this agent's requests (below its declared window)."""


@dataclass(frozen=True)
class Scenario:
    name: str
    roles: tuple[Role, ...]
    prompt_chars: int = 400
    kills: bool = False
    ahead: float | None = None
    """``ContextPolicy.compact_ahead_at`` of every agent (None: compaction ahead off)."""

    def role(self, name: str) -> Role:
        return next(r for r in self.roles if r.name == name)


DEEP_TREE = (
    Role("supervisor", 30_000, children=("lead",)),
    Role("lead", 12_000, children=("analyst_1", "analyst_2")),
    Role("analyst_1", 7_000, calls=20, result_chars=5_000),
    Role("analyst_2", 8_000, calls=20, result_chars=5_000),
)
"""Supervisor 30k -> lead 12k -> analysts 7k / 8k (with a ~2k-token static prompt)."""
RESEARCHERS_25 = (
    Role("supervisor", 30_000, children=("researcher_a", "researcher_b")),
    Role("researcher_a", 9_000, calls=25),
    Role("researcher_b", 16_000, calls=25, limit=10_000),
)
"""Supervisor 30k -> researchers 9k / 16k, the 16k one refused above 10k (its real limit)."""

SCENARIOS = {
    s.name: s
    for s in (
        Scenario(
            "researchers-6",
            (
                Role("supervisor", 30_000, children=("researcher_a", "researcher_b")),
                Role("researcher_a", 9_000, calls=6),
                Role("researcher_b", 16_000, calls=6),
            ),
        ),
        Scenario(
            "researchers-25-limit",
            RESEARCHERS_25,
        ),
        Scenario(
            "deep-tree",
            DEEP_TREE,
            prompt_chars=7_500,
        ),
        Scenario(
            "deep-tree-kill9",
            DEEP_TREE,
            prompt_chars=7_500,
            kills=True,
        ),
        Scenario(
            "deep-tree-ahead",
            DEEP_TREE,
            prompt_chars=7_500,
            ahead=0.45,
        ),
        Scenario(
            "researchers-25-ahead",
            RESEARCHERS_25,
            ahead=0.4,
        ),
        Scenario(
            "huge-output",
            (
                Role("supervisor", 30_000, children=("reader",)),
                Role("reader", 16_000, calls=3, result_chars=60_000, facts_per_result=8),
            ),
        ),
    )
}


def tool_output(scenario: Scenario, role: Role, index: int) -> str:
    """The deterministic output of call ``index`` of ``role``: prose with fact tokens."""
    parts = max(1, role.facts_per_result)
    size = role.result_chars // parts
    chunks = []
    for part in range(parts):
        body = prose(f"{scenario.name}:{role.name}:{index}:{part}", size - 40)
        cut = len(body) // 3
        token = fact_token(role.name, index, part)
        chunks.append(f"{body[:cut]} Finding {index}.{part}: {token}. {body[cut:]}")
    return "\n".join(chunks)


def agents_for(scenario: Scenario) -> Agent:
    """The scenario's root agent (its sub-agents nested), with a lookup tool per worker."""

    def build(role: Role) -> Agent:
        tools = []
        if role.calls:

            @tool(name="lookup")
            def lookup(topic: str) -> str:
                """Look a topic up; returns a long passage."""
                index = int(topic.rsplit(" ", 1)[-1])
                return tool_output(scenario, role, index)

            tools.append(lookup)
        instructions = (
            f"ROLE={role.name}. You are {role.name}. Report every finding token you saw. "
            + prose(f"prompt:{role.name}", scenario.prompt_chars)
        )
        return Agent(
            name=role.name,
            model="claude-fidelity-1",
            instructions=instructions,
            tools=tools,
            subagents=[build(scenario.role(c)) for c in role.children],
            max_turns=400,
            context=ContextPolicy(window=role.window, compact_ahead_at=scenario.ahead),
        )

    return build(scenario.roles[0])


# ---------------------------------------------------------------------------- the model
@dataclass
class Counters:
    summarizer_input: int = 0
    summarizer_output: int = 0
    summaries: int = 0
    requests: int = 0
    too_long: int = 0


class FidelityPolicy:
    """The perfect model of the module docstring (deterministic per request)."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.calls: dict[str, int] = {}
        self.answers: dict[str, ModelResponse] = {}
        self.counters = Counters()
        self.kill_at: int | None = None
        self.victim: int | None = None
        self.kills = 0

    def arm(self, pid: int, after: int) -> None:
        self.victim, self.kill_at = pid, self.counters.requests + after

    async def request(self, request: ModelRequest) -> ModelResponse:
        if self.victim is not None and self.kill_at is not None:
            if self.counters.requests >= self.kill_at:
                os.kill(self.victim, signal.SIGKILL)
                self.kills += 1
                self.victim = self.kill_at = None
                raise ModelConnectionError("killed")
        self.counters.requests += 1
        role = self._role(request)
        tokens = estimate_request(request)
        if role.limit is not None and tokens > role.limit:
            self.counters.too_long += 1
            raise PromptTooLongError(f"prompt is too long: {tokens} tokens > {role.limit} maximum")
        key = request.fingerprint()
        if key in self.answers:
            return self.answers[key]
        if is_summary_request(request):
            content = self._summary(request)
            output = estimate_messages([Message(role="assistant", content=tuple(content))])
            self.counters.summaries += 1
            self.counters.summarizer_input += tokens
            self.counters.summarizer_output += output
        elif role.children:
            content = self._manage(role, request, key)
        else:
            content = self._work(role, request, key)
        stop = "tool_use" if any(isinstance(b, ToolUseBlock) for b in content) else "end_turn"
        response = ModelResponse(
            id="msg_" + key[:24],
            model=request.model,
            content=tuple(content),
            stop_reason=stop,
            usage=Usage(
                input_tokens=tokens,
                output_tokens=estimate_messages(
                    [Message(role="assistant", content=tuple(content))]
                ),
            ),
        )
        self.answers[key] = response
        return response

    def _role(self, request: ModelRequest) -> Role:
        for block in request.system:
            match = ROLE.search(block.text)
            if match:
                return self.scenario.role(match.group(1))
        raise ValueError("no ROLE= in the system prompt")

    @staticmethod
    def _facts(messages: Iterable[Message]) -> list[str]:
        seen: dict[str, None] = {}
        for message in messages:
            for block in message.content:
                text = getattr(block, "text", None) or getattr(block, "content", None)
                if isinstance(text, str):
                    seen.update(dict.fromkeys(FACT.findall(text)))
                elif isinstance(block, ToolUseBlock):
                    seen.update(dict.fromkeys(FACT.findall(json.dumps(block.input))))
        return list(seen)

    def _summary(self, request: ModelRequest) -> list[Block]:
        facts = self._facts(request.messages)
        return [
            TextBlock(
                text="<analysis>Collected every finding.</analysis>\n<summary>\n"
                + "Findings so far: "
                + (", ".join(facts) or "none")
                + "\nNext steps: continue the task.\n</summary>"
            )
        ]

    def _report(self, request: ModelRequest) -> list[Block]:
        facts = self._facts(request.messages)
        return [TextBlock(text="Findings: " + (", ".join(facts) or "none"))]

    def _manage(self, role: Role, request: ModelRequest, key: str) -> list[Block]:
        if any(u.name == "spawn_agent" for m in request.messages for u in m.tool_uses):
            return self._report(request)
        return [
            ToolUseBlock(
                id=f"toolu_{key[:16]}s{i}",
                name="spawn_agent",
                input={"agent": child, "task": f"Investigate area {child}; report every finding."},
            )
            for i, child in enumerate(role.children)
        ]

    def _work(self, role: Role, request: ModelRequest, key: str) -> list[Block]:
        last = request.messages[-1]
        for result in last.tool_results:
            page = PAGE.search(result.content)
            truncated = _TRUNCATED.search(result.content)
            if page or truncated:
                handle, offset = (
                    (page.group(1), int(page.group(2)))
                    if page
                    else (truncated.group(2), int(truncated.group(1).replace(",", "")))  # type: ignore[union-attr]
                )
                return [
                    ToolUseBlock(
                        id=f"toolu_{key[:16]}p",
                        name="recall",
                        input={"id": handle, "offset": offset},
                    )
                ]
        done = self.calls.get(role.name, 0)
        if done >= role.calls:
            return self._report(request)
        self.calls[role.name] = done + 1
        return [
            ToolUseBlock(
                id=f"toolu_{key[:16]}c{done}",
                name="lookup",
                input={"topic": f"{role.name} item {done}"},
            )
        ]
