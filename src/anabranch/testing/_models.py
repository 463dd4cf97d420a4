"""Test models: run agents offline and script exact conversations."""

from __future__ import annotations

import hashlib
import inspect
import re
from collections.abc import Callable, Collection, Sequence
from typing import Any

from anabranch.context._compaction import is_compaction_message
from anabranch.context._output import schema_in
from anabranch.context._tokens import estimate_messages, estimate_request
from anabranch.messages import (
    Block,
    Message,
    ModelRequest,
    ModelResponse,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolDefinition,
    ToolUseBlock,
    Usage,
    canonical_json,
)
from anabranch.testing._memory_answers import memory_answer
from anabranch.testing._signing import redacted_block, thinking_block

__all__ = [
    "FunctionModel",
    "TestModel",
    "arguments_for_schema",
    "is_summary_request",
    "response_for",
    "usage_for",
]

SUMMARY_TAG = "<summary>"
_SUMMARY_WRAPPER = "<summary_of_earlier_conversation>"
_DROPPED = "<dropped_messages>"
_ROUND_ID = re.compile(r"^toolu_[0-9a-f]{20}r(\d+)$")
_ASKED = re.compile(r"^User asked: (.*)$", re.MULTILINE)
_ROUNDS = re.compile(r"^Tool rounds done: (\d+)$", re.MULTILINE)
_PART_TAG = "<conversation_part "
_NAMED_ROUND = re.compile(r"toolu_[0-9a-f]{20}r(\d+)\b")
_SO_FAR = re.compile(r"<summary_so_far>\n(.*?)\n</summary_so_far>", re.DOTALL)
_PLAIN_USER = re.compile(r"^\(user[^)]*\)\n(.+)$", re.MULTILINE)
_NOTED_ROUND = re.compile(r"\[tool (?:call|result of) \S+ id=toolu_[0-9a-f]{20}r(\d+)[:\]]")
"""A tool call or result written as a one-line note: in a part of a long range rendered
for the summarizer, and in the turns the ``verbatim`` strategy keeps word for word."""


def is_summary_request(request: ModelRequest) -> bool:
    """True when the last user turn asks for a ``<summary>`` (a compaction request)."""
    if not request.messages or request.messages[-1].role != "user":
        return False
    return SUMMARY_TAG in request.messages[-1].text


def usage_for(request: ModelRequest, content: Sequence[Block]) -> Usage:
    """Deterministic usage from the same estimate the runtime uses (no caching)."""
    output = estimate_messages([Message(role="assistant", content=tuple(content))])
    thinking = [b for b in content if isinstance(b, ThinkingBlock | RedactedThinkingBlock)]
    thought = estimate_messages([Message(role="assistant", content=tuple(thinking))])
    return Usage(
        input_tokens=estimate_request(request),
        output_tokens=output,
        thinking_tokens=thought if thinking else 0,
    )


def response_for(request: ModelRequest, content: Sequence[Block]) -> ModelResponse:
    """A deterministic response carrying ``content``, with ``usage_for`` usage."""
    stop = "tool_use" if any(isinstance(b, ToolUseBlock) for b in content) else "end_turn"
    return ModelResponse(
        id="msg_" + request.fingerprint()[:24],
        model=request.model,
        content=tuple(content),
        stop_reason=stop,
        usage=usage_for(request, content),
    )


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        resolved = root.get("$defs", {}).get(ref.split("/")[-1], {})
        return dict(resolved) if isinstance(resolved, dict) else {}
    return schema


def _value_for(
    name: str, schema: dict[str, Any], root: dict[str, Any], seed: int, hint: str = ""
) -> Any:
    schema = _resolve(schema, root)
    if "enum" in schema:
        return schema["enum"][seed % len(schema["enum"])]
    if "const" in schema:
        return schema["const"]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = [o for o in schema[key] if _resolve(o, root).get("type") != "null"]
            chosen = options[0] if options else schema[key][0]
            return _value_for(name, chosen, root, seed, hint)
    kind = schema.get("type", "string")
    if kind == "integer":
        return max(int(schema.get("minimum", 1)), 1 if "minimum" not in schema else 0)
    if kind == "number":
        return float(schema.get("minimum", 1.0))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if kind == "array":
        item = _value_for(name, schema.get("items", {}), root, seed, hint)
        return [item] * max(int(schema.get("minItems", 1)), 1)
    if kind == "object":
        return arguments_for_schema(schema, root=root, seed=seed, hint=hint)
    text = f"{name} {seed + 1}"
    constrained = "pattern" in schema or "format" in schema
    if hint and not constrained and len(hint) <= int(schema.get("maxLength", len(hint))):
        text = hint
    min_length = int(schema.get("minLength", 0))
    return text.ljust(min_length, "x")


def arguments_for_schema(
    schema: dict[str, Any],
    *,
    root: dict[str, Any] | None = None,
    seed: int = 0,
    hint: str = "",
) -> dict[str, Any]:
    """Schema-valid arguments for an object schema (required properties only).

    Free-text string properties get ``hint`` (e.g. the task) when it fits their schema.
    """
    root = root if root is not None else schema
    properties: dict[str, Any] = schema.get("properties", {})
    required = schema.get("required", list(properties))
    return {
        name: _value_for(name, properties[name], root, seed, hint)
        for name in required
        if name in properties
    }


def _enum_fanout(definition: ToolDefinition) -> int:
    """How many calls a tool gets in one turn: one per value of its first enum property."""
    properties: dict[str, Any] = definition.input_schema.get("properties", {})
    for prop in properties.values():
        resolved = _resolve(prop, definition.input_schema)
        if "enum" in resolved:
            return len(resolved["enum"])
    return 1


class TestModel:
    """Offline model: calls every tool with schema-valid arguments, then reports.

    Each user task gets ``rounds`` turns of tool calls (every tool once per turn; a tool
    with an enum parameter once per enum value, so a supervisor spawns each sub-agent),
    then a final text answer summarising the tool results it saw (at once when the request
    says ``tool_choice="none"``). A compaction request
    (a user turn asking for ``<summary>``) is answered with an ``<analysis>``/``<summary>``;
    the memory extraction and consolidation requests with their tool's call (see
    ``testing._memory_answers``).
    Tool ids carry their round number, so the count survives compaction: a compacted
    context's opening turn is not a new task. Tools in ``skip_tools`` (the built-in
    ``recall`` and ``forget``, by default) are never called. A request with thinking on is
    answered like the real models do: a signed thinking block first (and, with
    ``redact_thinking``, a redacted one after it), then the text or tool calls.
    Deterministic: the same request always gets the same response (so the same agent given
    the same task twice reuses its tool_use ids; different agents never share them).
    """

    __test__ = False  # not a pytest class

    def __init__(
        self,
        *,
        rounds: int = 1,
        report_chars: int = 240,
        skip_tools: Collection[str] = ("recall", "forget"),
        redact_thinking: bool = False,
    ) -> None:
        if rounds < 0:
            raise ValueError("rounds must be >= 0")
        self.redact_thinking = redact_thinking
        self.rounds = rounds
        self.report_chars = report_chars
        self.skip_tools = frozenset(skip_tools)
        self.requests: list[ModelRequest] = []

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        content = self.respond(request)
        if request.settings.thinking:
            content = [*self._thinking(request, content), *content]
        return response_for(request, content)

    def _thinking(self, request: ModelRequest, answer: Sequence[Block]) -> list[Block]:
        plan = "call " + ", ".join(sorted({b.name for b in answer if isinstance(b, ToolUseBlock)}))
        text = (
            f"Turn {len(request.messages)}: the request is "
            f"{' '.join(self._asked(request.messages).split())[:120]!r}; next I will "
            f"{plan if plan != 'call ' else 'write the report'}."
        )
        blocks: list[Block] = [thinking_block(text)]
        if self.redact_thinking:
            blocks.append(redacted_block(f"redacted:{len(request.messages)}"))
        return blocks

    def respond(self, request: ModelRequest) -> list[Block]:
        """The content blocks this model answers ``request`` with."""
        remembered = memory_answer(request)
        if remembered is not None:
            return remembered
        if is_summary_request(request):
            last = request.messages[-1].text
            if _PART_TAG in last:
                return [TextBlock(text=self._part_summary(last))]
            return [TextBlock(text=self._summary(request.messages[:-1]))]
        rounds_done = self._rounds_since_task(request.messages)
        callable_tools = [t for t in request.tools if t.name not in self.skip_tools]
        if request.settings.tool_choice == "none":
            callable_tools = []
        forced = request.settings.forces_tool_use
        if forced and request.settings.tool_choice != "any":  # one named tool
            callable_tools = [t for t in request.tools if t.name == request.settings.tool_choice]
        if callable_tools and (rounds_done < self.rounds or forced):
            return self._tool_calls(request, callable_tools, rounds_done)
        schema = schema_in("\n".join(b.text for b in request.system))
        if schema is not None:  # an output_type agent: answer with a schema-valid object
            hint = " ".join(self._asked(request.messages).split())[:200]
            return [TextBlock(text=canonical_json(arguments_for_schema(schema, hint=hint)))]
        return [TextBlock(text=self._report(request.messages))]

    @staticmethod
    def _rounds_since_task(messages: Sequence[Message]) -> int:
        rounds = 0
        for message in reversed(messages):
            if message.role == "assistant" and message.tool_uses:
                match = _ROUND_ID.match(message.tool_uses[0].id)
                if match:
                    return int(match.group(1)) + 1 + rounds
                rounds += 1
            elif elided := _NOTED_ROUND.findall(message.text):
                # a turn the verbatim strategy kept word for word, its tool blocks as notes
                return rounds + max(int(r) for r in elided) + 1
            elif message.role == "user" and not message.tool_results:
                # a compaction that kept no tool call says how many ran (in its summary,
                # or by the call ids its note of dropped messages lists)
                if not is_compaction_message(message):
                    break
                match = _ROUNDS.search(message.text)
                named = [int(r) + 1 for r in _NAMED_ROUND.findall(message.text)]
                return rounds + max([int(match.group(1)) if match else 0, *named])
        return rounds

    def _tool_calls(
        self, request: ModelRequest, tools: Sequence[ToolDefinition], round_index: int
    ) -> list[Block]:
        # Ids hash the agent's prompt (system and tools), the turn and the last user text:
        # agents given the same task never share ids, and nothing random in the context
        # (run ids, spill handles) changes them, so equal sessions get equal ids.
        salt = hashlib.sha256(
            canonical_json(
                [
                    [b.text for b in request.system],
                    [t.name for t in request.tools],
                    len(request.messages),
                    request.messages[-1].text,
                ]
            ).encode()
        ).hexdigest()
        blocks: list[Block] = []
        hint = " ".join(self._asked(request.messages).split())[:200]
        for definition in tools:
            for seed in range(_enum_fanout(definition)):
                call_id = hashlib.sha256(
                    f"{salt}:{definition.name}:{seed}:{round_index}".encode()
                ).hexdigest()[:20]
                blocks.append(
                    ToolUseBlock(
                        id=f"toolu_{call_id}r{round_index}",
                        name=definition.name,
                        input=arguments_for_schema(definition.input_schema, seed=seed, hint=hint),
                    )
                )
        return blocks

    @staticmethod
    def _question_index(messages: Sequence[Message]) -> int:
        """Where the latest question starts: a conversation's latest user text turn, or
        the first user turn (also a compacted context's opening summary)."""
        for index in range(len(messages) - 1, 0, -1):
            message = messages[index]
            if message.role == "user" and message.text and not message.tool_results:
                if not is_compaction_message(message):
                    return index
        return 0

    @classmethod
    def _asked(cls, messages: Sequence[Message]) -> str:
        """The latest request, also through a compacted context's opening turn."""
        start = cls._question_index(messages)
        first = next((m for m in messages[start:] if m.role == "user" and m.text), None)
        if first is None:
            return ""
        if not is_compaction_message(first):
            return first.text
        texts = [b.text for b in first.content[1:] if isinstance(b, TextBlock)]
        carried = [t for t in texts[1:] if not t.startswith((_SUMMARY_WRAPPER, _DROPPED))]
        if carried:  # a conversation's turn kept with the opening: the latest question
            return carried[-1]
        body = "\n".join(texts)
        match = _ASKED.search(body)
        return match.group(1) if match else body.strip()

    def _report(self, messages: Sequence[Message]) -> str:
        task = self._asked(messages)
        lines = [f"Report on: {task[: self.report_chars]}"]
        names = {b.id: b.name for m in messages for b in m.tool_uses}
        for message in messages[self._question_index(messages) :]:
            for result in message.tool_results:
                status = "error" if result.is_error else "ok"
                snippet = " ".join(result.content.split())[: self.report_chars]
                lines.append(f"- {names.get(result.tool_use_id, '?')} ({status}): {snippet}")
        if len(lines) == 1:
            lines.append("- no tool results")
        return "\n".join(lines)

    def _part_summary(self, text: str) -> str:
        """A summary of one part of a long range (rendered as text) and the summary so far."""
        found = _SO_FAR.search(text)
        so_far = found.group(1) if found else ""
        part = text[found.end() :] if found else text
        requests = [
            m
            for m in _PLAIN_USER.finditer(part)
            if not m.group(1).startswith(("[tool result", "<compacted_context"))
        ]
        rounds_match = _ROUNDS.search(so_far) or _ROUNDS.search(part)
        rounds = int(rounds_match.group(1)) if rounds_match else 0
        if requests:  # a newer request in this part: it is what was asked, rounds restart
            asked = requests[-1].group(1)
            part, rounds = part[requests[-1].end() :], 0
        else:
            asked_match = _ASKED.search(so_far) or _ASKED.search(part)
            asked = asked_match.group(1) if asked_match else "(nothing)"
        rounds = max([rounds, *(int(r) + 1 for r in _NOTED_ROUND.findall(part))])
        body = [
            f"User asked: {asked[: self.report_chars]}",
            f"Tool rounds done: {rounds}",
            "Next steps: continue the task.",
        ]
        return (
            "<analysis>Reviewed this part.</analysis>\n<summary>\n"
            + "\n".join(body)
            + "\n</summary>"
        )

    def _summary(self, messages: Sequence[Message]) -> str:
        asked = self._asked(messages)
        tools = sorted({b.name for m in messages for b in m.tool_uses})
        results = [r for m in messages for r in m.tool_results]
        facts = [" ".join(r.content.split())[: self.report_chars] for r in results[-3:]]
        body = [
            f"User asked: {asked[: self.report_chars] if asked else '(nothing)'}",
            f"Messages summarized: {len(messages)}",
            f"Tools used: {', '.join(tools) or 'none'}",
            f"Tool rounds done: {self._rounds_since_task(messages)}",
            *(f"Result: {fact}" for fact in facts),
            "Next steps: continue the task.",
        ]
        return (
            "<analysis>Reviewed the conversation so far.</analysis>\n<summary>\n"
            + "\n".join(body)
            + "\n</summary>"
        )


class FunctionModel:
    """A model whose answers come from your function (sync or async).

    The function receives the ``ModelRequest`` and returns a ``ModelResponse``, a string
    (one text block) or a list of blocks. Raise a ``ModelError`` to simulate API errors.
    As with the real API, a request with ``tool_choice="none"`` must not be answered with
    a tool call (``ValueError``).
    Every request is kept in ``requests``.
    """

    def __init__(self, function: Callable[[ModelRequest], Any]) -> None:
        self.function = function
        self.requests: list[ModelRequest] = []

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        result = self.function(request)
        if inspect.isawaitable(result):
            result = await result
        response = (
            result
            if isinstance(result, ModelResponse)
            else response_for(
                request, [TextBlock(text=result)] if isinstance(result, str) else list(result)
            )
        )
        if request.settings.tool_choice == "none" and response.to_message().tool_uses:
            # the real API never calls a tool when told not to: a function that does is wrong
            raise ValueError("the function called a tool in a request with tool_choice 'none'")
        return response
