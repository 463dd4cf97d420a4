"""The tool_use / tool_result pairing rules of the Messages API, as a checker."""

from __future__ import annotations

from collections.abc import Sequence

from anabranch.messages import Message

__all__ = ["pairing_violations"]


def pairing_violations(messages: Sequence[Message]) -> list[str]:
    """Every rule the API would reject ``messages`` for; empty when they are valid.

    Rules: the first message is a user turn; roles alternate; every tool_use is answered
    by a tool_result in the very next (user) message; tool_results come first there and
    answer only the previous message's tool_uses; tool_use ids are unique.
    """
    problems: list[str] = []
    if messages and messages[0].role != "user":
        problems.append("messages.0: the first message must be a user turn")
    seen_ids: set[str] = set()
    for index, message in enumerate(messages):
        if index and messages[index - 1].role == message.role:
            problems.append(f"messages.{index}: roles must alternate")
        for use in message.tool_uses:
            if use.id in seen_ids:
                problems.append(f"messages.{index}: duplicate tool_use id {use.id}")
            seen_ids.add(use.id)
        previous = messages[index - 1] if index else None
        expected = {u.id for u in previous.tool_uses} if previous else set()
        results = message.tool_results
        answered = {r.tool_use_id for r in results}
        unexpected = sorted(answered - expected)
        if unexpected:
            problems.append(f"messages.{index}: unexpected tool_use_id {', '.join(unexpected)}")
        if expected and message.role == "user":
            missing = sorted(expected - answered)
            if missing:
                problems.append(f"messages.{index - 1}: tool_use without result: {missing}")
        first_other = next(
            (i for i, b in enumerate(message.content) if b.type != "tool_result"), None
        )
        if first_other is not None and any(
            b.type == "tool_result" for b in message.content[first_other:]
        ):
            problems.append(f"messages.{index}: tool_result blocks must come first")
    if messages and messages[-1].tool_uses:
        problems.append(f"messages.{len(messages) - 1}: ends with unanswered tool_use")
    return problems
