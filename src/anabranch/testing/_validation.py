"""The Messages API's request rules, with its own error wording.

Checked in this order; the first violation is reported as a 400 ``invalid_request_error``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from anabranch._thinking_models import accepts_thinking_mode, prefix_bound, thinking_always_on
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
from anabranch.testing._signing import (
    bound_prefix,
    chained,
    compaction_content,
    compaction_record,
    leading_compaction,
    request_chain,
    sealed,
    signature_valid,
)
from anabranch.testing._wire import APIFailure, WireRequest

__all__ = ["COMPACT_BETA", "MAX_BREAKPOINTS", "check_bindings", "validate"]

MAX_BREAKPOINTS = 4


def _invalid(message: str) -> APIFailure:
    return APIFailure.invalid(message)


def _check_roles(messages: Sequence[Message]) -> None:
    if not messages:
        raise _invalid("messages: at least one message is required")
    record = leading_compaction(messages)
    if record is not None:
        # the block stands in place of the messages it summarized: the first kept message
        # must not have the role of the last of them (the API would merge the two)
        if len(messages) > 1 and messages[1].role == record[2]:
            raise _invalid(
                "messages.1: the first message after a `compaction` block has the role "
                f'"{record[2]}" of the last summarized message; it must have the other role'
            )
        kept = messages[1:]
    else:
        kept = messages
        if messages[0].role != "user":
            raise _invalid('messages: first message must use the "user" role')
    for previous, current in zip(kept, kept[1:], strict=False):
        if previous.role == current.role:
            raise _invalid(
                'messages: roles must alternate between "user" and "assistant", '
                f'but found multiple "{current.role}" roles in a row'
            )


COMPACT_BETA = "compact-2026-09-04"


def _check_compaction(wire: WireRequest, betas: frozenset[str]) -> None:
    """A ``compaction`` block only opens ``messages``, with the signature it came with;
    the parameter and the block need the beta; a compaction request compacts only."""
    messages = wire.request.messages
    found = False
    for i, message in enumerate(messages):
        for j, block in enumerate(message.content):
            parts = compaction_content(block)
            if parts is None:
                continue
            found = True
            if (i, j) != (0, 0):
                raise _invalid(
                    f"messages.{i}.content.{j}: a `compaction` block must be the first block of "
                    "the first message"
                )
            content, signature = parts
            if content is not None and (
                signature is None or compaction_record(content, signature) is None
            ):
                raise _invalid(
                    f"messages.{i}.content.{j}: Invalid `signature` in `compaction` block"
                )
    if (found or wire.compaction) and COMPACT_BETA not in betas:
        what = "`compaction` blocks" if found else "the `compaction` parameter"
        raise _invalid(f"{what} require the `anthropic-beta: {COMPACT_BETA}` header")
    if wire.compaction and wire.context_management:
        raise _invalid("`compaction` cannot be combined with `context_management`")


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


_ADAPTIVE_HINT = (
    'Use "thinking.type.adaptive" and "output_config.effort" to control thinking behavior.'
)


def _check_mode(wire: WireRequest) -> None:
    """What the model's family accepts as ``thinking.type``."""
    model, kind = wire.request.model, wire.thinking_type
    if kind == "enabled" and not accepts_thinking_mode(model, "enabled"):
        raise _invalid(f'"thinking.type.enabled" is not supported for this model. {_ADAPTIVE_HINT}')
    if kind == "adaptive" and not accepts_thinking_mode(model, "adaptive"):
        raise _invalid("adaptive thinking is not supported on this model")
    if kind == "disabled" and thinking_always_on(model):
        raise _invalid(
            f'"thinking.type.disabled" is not supported for this model. {_ADAPTIVE_HINT}'
        )


def _check_settings(request: ModelRequest, *, count_tokens: bool) -> None:
    """The rules between thinking, sampling and tool choice."""
    settings = request.settings
    if not settings.thinking:
        return
    budget = settings.thinking_budget
    if budget is not None and not count_tokens and request.max_tokens <= budget:
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
    tool loop starts with its thinking (not on models with preserved thinking, where the
    API itself says to remove a block bound to another prefix, and drops it on request);
    with it off, the final turn carries none."""
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
    if prefix_bound(request.model):
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


def validate(
    wire: WireRequest, *, context_limit: int | None, betas: frozenset[str] = frozenset()
) -> None:
    """Raise ``APIFailure`` (400) for the first rule ``wire`` breaks.

    ``context_limit`` is the maximum prompt size in tokens; ``None`` skips that check
    (``count_tokens`` counts prompts of any size).
    """
    request = wire.request
    messages = request.messages
    _check_compaction(wire, betas)
    _check_roles(messages)
    _check_content(messages)
    _check_unique_ids(messages)
    _check_pairing(messages)
    _check_mode(wire)
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


def _binding_error(i: int, j: int, block: ThinkingBlock | RedactedThinkingBlock) -> APIFailure:
    field = "signature" if isinstance(block, ThinkingBlock) else "data"
    return _invalid(
        f"messages.{i}.content.{j}: Invalid `{field}` in `{block.type}` block. The block is "
        "bound to a different conversation. Remove the block, or set "
        '`thinking.block_binding.prefix_mismatch_behavior` to "drop_block".'
    )


def check_bindings(wire: WireRequest) -> tuple[WireRequest, tuple[str, ...]]:
    """Preserved thinking: each thinking block must come back after exactly the prefix it
    was produced after (system, tools, every earlier message and block). The first that
    does not, and every later one, are invalid: a 400, or with ``drop_block`` removed
    from the request (the paths of the removed blocks are returned)."""
    request = wire.request
    if not prefix_bound(request.model):
        return wire, ()
    messages = request.messages
    state, first = request_chain(request.system, request.tools, messages)
    for i in range(first, len(messages)):
        message = messages[i]
        for j, block in enumerate(message.content):
            if not isinstance(block, ThinkingBlock | RedactedThinkingBlock):
                continue
            if bound_prefix(block) == sealed(state, message.content[:j]):
                continue
            if not wire.drop_mismatched_thinking:
                raise _binding_error(i, j, block)
            return _dropped_from(wire, i, j)
        state = chained(state, message)
    return wire, ()


def _dropped_from(wire: WireRequest, first: int, at: int) -> tuple[WireRequest, tuple[str, ...]]:
    """``wire`` without every thinking block from ``messages[first].content[at]`` on."""
    kept: list[Message] = []
    dropped: list[str] = []
    for i, message in enumerate(wire.request.messages):
        if i < first or not message.thinking_blocks:
            kept.append(message)
            continue
        blocks = []
        for j, block in enumerate(message.content):
            if isinstance(block, ThinkingBlock | RedactedThinkingBlock) and (i > first or j >= at):
                dropped.append(f"messages.{i}.content.{j}")
                continue
            blocks.append(block)
        kept.append(message.model_copy(update={"content": tuple(blocks)}))
    request = wire.request.model_copy(update={"messages": tuple(kept)})
    return replace(wire, request=request), tuple(dropped)
