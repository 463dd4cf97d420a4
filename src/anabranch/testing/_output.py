"""Output-side accounting: output tokens of an answer, and the cut at ``max_tokens``."""

from __future__ import annotations

from anabranch.context._tokens import estimate_messages
from anabranch.messages import Block, Message, ModelResponse, TextBlock

__all__ = ["fit_to_max_tokens", "output_tokens"]


def output_tokens(content: tuple[Block, ...]) -> int:
    """Estimated tokens of an answer (the same estimate as every other count here)."""
    return estimate_messages([Message(role="assistant", content=content)]) if content else 0


def _longest_text_prefix(kept: list[Block], text: str, budget: int) -> int:
    """Largest n such that ``kept + [text[:n]]`` fits in ``budget`` tokens (0 if none)."""
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        candidate = (*kept, TextBlock(text=text[:middle]))
        if output_tokens(candidate) <= budget:
            low = middle
        else:
            high = middle - 1
    return low


def fit_to_max_tokens(response: ModelResponse, max_tokens: int) -> ModelResponse:
    """``response`` cut where the model would have run out of ``max_tokens``.

    An answer that fits is returned unchanged. Otherwise text is cut mid-block, a tool_use
    that does not fit is left out, ``stop_reason`` becomes ``max_tokens`` and the output
    usage is exactly ``max_tokens``.
    """
    if output_tokens(response.content) <= max_tokens:
        return response
    kept: list[Block] = []
    for block in response.content:
        if output_tokens((*kept, block)) <= max_tokens:
            kept.append(block)
            continue
        if isinstance(block, TextBlock):
            cut = _longest_text_prefix(kept, block.text, max_tokens)
            if cut:
                kept.append(TextBlock(text=block.text[:cut]))
        break
    usage = response.usage.model_copy(update={"output_tokens": max_tokens})
    return response.model_copy(
        update={"content": tuple(kept), "stop_reason": "max_tokens", "usage": usage}
    )
