"""The Messages API's request rules, with its own error wording.

Checked in this order; the first violation is reported as a 400 ``invalid_request_error``.
"""

from __future__ import annotations

from collections.abc import Sequence

from anabranch.context._tokens import estimate_request
from anabranch.messages import (
    Message,
    ModelRequest,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from anabranch.testing._signing import signature_valid
from anabranch.testing._wire import APIFailure, WireRequest

__all__ = ["MAX_BREAKPOINTS", "validate"]

MAX_BREAKPOINTS = 4


def _invalid(message: str) -> APIFailure:
    return APIFailure.invalid(message)


def _check_roles(messages: Sequence[Message]) -> None:
    if not messages:
        raise _invalid("messages: at least one message is required")
    if messages[0].role != "user":
        raise _invalid('messages: first message must use the "user" role')
    for previous, current in zip(messages, messages[1:], strict=False):
        if previous.role == current.role:
            raise _invalid(
                'messages: roles must alternate between "user" and "assistant", '
                f'but found multiple "{current.role}" roles in a row'
            )


def _check_content(messages: Sequence[Message]) -> None:
    last = len(messages) - 1
    for i, message in enumerate(messages):
        if not message.content and not (i == last and message.role == "assistant"):
            raise _invalid(
                f"messages.{i}: all messages must have non-empty content except for "
                "the optional final assistant message"
            )
        for j, block in enumerate(message.content):
            if isinstance(block, TextBlock) and not block.text:
                raise _invalid("messages: text content blocks must be non-empty")
            if isinstance(block, ToolUseBlock) and message.role != "assistant":
                raise _invalid(
                    f"messages.{i}.content.{j}: `tool_use` blocks can only be in "
                    "`assistant` messages"
                )
            if isinstance(block, ToolResultBlock) and message.role != "user":
                raise _invalid(
                    f"messages.{i}.content.{j}: `tool_result` blocks can only be in `user` messages"
                )
    final = messages[last]
    if final.role == "assistant" and final.content:
        tail = final.content[-1]
        if isinstance(tail, TextBlock) and tail.text != tail.text.rstrip():
            raise _invalid("messages: final assistant content cannot end with trailing whitespace")


def _check_unique_ids(messages: Sequence[Message]) -> None:
    seen: set[str] = set()
    for i, message in enumerate(messages):
        for j, block in enumerate(message.content):
            if isinstance(block, ToolUseBlock):
                if block.id in seen:
                    raise _invalid(f"messages.{i}.content.{j}: `tool_use` ids must be unique")
                seen.add(block.id)


def _leading_results(message: Message) -> list[ToolResultBlock]:
    """The run of ``tool_result`` blocks a user message starts with."""
    leading: list[ToolResultBlock] = []
    for block in message.content:
        if not isinstance(block, ToolResultBlock):
            break
        leading.append(block)
    return leading


def _check_pairing(messages: Sequence[Message]) -> None:
    """Every ``tool_use`` answered at the start of the next message; no stray results."""
    for i, message in enumerate(messages):
        if message.role == "assistant":
            uses = [b.id for b in message.tool_uses]
            if not uses:
                continue
            following = messages[i + 1] if i + 1 < len(messages) else None
            answered = {r.tool_use_id for r in _leading_results(following)} if following else set()
            missing = [u for u in uses if u not in answered]
            if missing:
                raise _invalid(
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have "
                    "a corresponding `tool_result` block in the next message."
                )
            continue
        previous = messages[i - 1] if i > 0 else None
        expected = {b.id for b in previous.tool_uses} if previous else set()
        seen: set[str] = set()
        for j, block in enumerate(message.content):
            if not isinstance(block, ToolResultBlock):
                continue
            if block.tool_use_id not in expected:
                unexpected = [
                    r.tool_use_id for r in message.tool_results if r.tool_use_id not in expected
                ]
                raise _invalid(
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in "
                    f"`tool_result` blocks: {', '.join(dict.fromkeys(unexpected))}. "
                    "Each `tool_result` block must have a corresponding `tool_use` block "
                    "in the previous message."
                )
            if block.tool_use_id in seen:
                raise _invalid(
                    f"messages.{i}.content.{j}: each tool_use must have a single result. "
                    f"Found multiple `tool_result` blocks with id: {block.tool_use_id}"
                )
            seen.add(block.tool_use_id)


_THINKING_DOCS = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"


def _check_settings(request: ModelRequest, *, count_tokens: bool) -> None:
    """The rules between thinking, sampling and tool choice."""
    settings = request.settings
    budget = settings.thinking_budget
    if budget is None:
        return
    if not count_tokens and request.max_tokens <= budget:
        raise _invalid(
            "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our "
            f"documentation at {_THINKING_DOCS}#max-tokens-and-context-window-size"
        )
    considerations = f"{_THINKING_DOCS}#important-considerations-when-using-extended-thinking"
    if settings.temperature is not None and settings.temperature != 1.0:
        raise _invalid(
            "`temperature` may only be set to 1 when thinking is enabled. Please consult "
            f"our documentation at {considerations}"
        )
    if settings.top_k is not None:
        raise _invalid(
            "`top_k` must be unset when thinking is enabled. Please consult our "
            f"documentation at {considerations}"
        )
    if settings.top_p is not None and settings.top_p < 0.95:
        raise _invalid(
            "`top_p` must be greater than or equal to 0.95 or unset when thinking is "
            f"enabled. Please consult our documentation at {considerations}"
        )
    if settings.forces_tool_use:
        raise _invalid("Thinking may not be enabled when tool_choice forces tool use.")


def _check_thinking(request: ModelRequest) -> None:
    """Thinking blocks come back unchanged; with thinking on, the last assistant turn of a
    tool loop starts with its thinking; with it off, the final turn carries none."""
    messages = request.messages
    for i, message in enumerate(messages):
        for j, block in enumerate(message.content):
            if not isinstance(block, ThinkingBlock | RedactedThinkingBlock):
                continue
            if message.role != "assistant":
                raise _invalid(
                    f"messages.{i}.content.{j}: `{block.type}` blocks can only be in "
                    "`assistant` messages"
                )
            if not signature_valid(block):
                field = "signature" if isinstance(block, ThinkingBlock) else "data"
                raise _invalid(
                    f"messages.{i}.content.{j}: Invalid `{field}` in `{block.type}` block"
                )
    last = len(messages) - 1
    if not request.settings.thinking:
        final = messages[last] if messages else None
        if final is not None and final.role == "assistant" and final.thinking_blocks:
            j = next(
                k
                for k, b in enumerate(final.content)
                if b.type in ("thinking", "redacted_thinking")
            )
            raise _invalid(
                f"messages.{last}.content.{j}: When thinking is disabled, an `assistant` "
                "message in the final position cannot contain `thinking`. To use thinking "
                "blocks, enable `thinking` in your request."
            )
        return
    index = next((k for k in range(last, -1, -1) if messages[k].role == "assistant"), None)
    if index is None or not messages[index].tool_uses:
        return
    first = messages[index].content[0]
    if first.type not in ("thinking", "redacted_thinking"):
        raise _invalid(
            f"messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, "
            f"but found `{first.type}`. When `thinking` is enabled, a final `assistant` "
            "message must start with a thinking block (preceeding the lastmost set of "
            "`tool_use` and `tool_result` blocks). We recommend you include thinking "
            "blocks from previous turns. To avoid this requirement, disable `thinking`. "
            f"Please consult our documentation at {_THINKING_DOCS}"
        )


def validate(wire: WireRequest, *, context_limit: int | None) -> None:
    """Raise ``APIFailure`` (400) for the first rule ``wire`` breaks.

    ``context_limit`` is the maximum prompt size in tokens; ``None`` skips that check
    (``count_tokens`` counts prompts of any size).
    """
    request = wire.request
    messages = request.messages
    _check_roles(messages)
    _check_content(messages)
    _check_unique_ids(messages)
    _check_pairing(messages)
    _check_settings(request, count_tokens=context_limit is None)
    _check_thinking(request)
    names = [t.name for t in request.tools]
    if len(set(names)) != len(names):
        raise _invalid("tools: Tool names must be unique.")
    if wire.breakpoint_count > MAX_BREAKPOINTS:
        raise _invalid(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {wire.breakpoint_count}."
        )
    if context_limit is not None:
        tokens = estimate_request(request)
        if tokens > context_limit:
            raise _invalid(f"prompt is too long: {tokens} tokens > {context_limit} maximum")
