"""Structured output: the instructions an ``output_type`` agent gets, and checking its answer.

Pure logic. The schema goes in the static system prompt (cache-stable); the answer is the
JSON object alone (a fenced block is accepted); a failed check goes back to the model as a
marked user turn naming the errors, at most ``output_retries`` times.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TypeVar

import pydantic

from anabranch.messages import Message, TextBlock

__all__ = [
    "OUTPUT_RETRY_MARKER",
    "output_instructions",
    "output_retries_used",
    "describe_errors",
    "parse_output",
    "retry_message",
    "schema_in",
]

OUTPUT_RETRY_MARKER = "<output_validation_failed>"
_SCHEMA_TAG = "output_schema"
T = TypeVar("T", bound=pydantic.BaseModel)
_FENCE = re.compile(r"^```(?:json)?\s*\n(.*?)\n?```$", re.DOTALL)


def output_instructions(output_type: type[pydantic.BaseModel]) -> str:
    """What the system prompt says about the final answer's shape."""
    schema = json.dumps(output_type.model_json_schema(), sort_keys=True, separators=(",", ":"))
    return (
        "Your final answer (the message in which you call no tool) must be one JSON object "
        "that matches this JSON schema, and nothing else: no prose, no code fence.\n"
        f"<{_SCHEMA_TAG}>{schema}</{_SCHEMA_TAG}>"
    )


def schema_in(text: str) -> dict[str, object] | None:
    """The output schema a system prompt carries, if any (test models answer to it)."""
    match = re.search(rf"<{_SCHEMA_TAG}>(.*?)</{_SCHEMA_TAG}>", text, re.DOTALL)
    if match is None:
        return None
    loaded = json.loads(match.group(1))
    return loaded if isinstance(loaded, dict) else None


def parse_output(text: str, output_type: type[T]) -> T:
    """``text`` validated as ``output_type``. Raises ``pydantic.ValidationError``."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    return output_type.model_validate_json(body)


def describe_errors(error: pydantic.ValidationError) -> str:
    """The validation errors, one per line, as the model should read them."""
    lines = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(the answer)"
        lines.append(f"- {where}: {item['msg']}")
    return "\n".join(lines)


def retry_message(error: pydantic.ValidationError, attempt: int, allowed: int) -> Message:
    """The user turn that sends a failed answer back with what was wrong."""
    return Message(
        role="user",
        content=(
            TextBlock(
                text=f"{OUTPUT_RETRY_MARKER} Your final answer did not match the required "
                f"JSON schema (attempt {attempt} of {allowed}):\n{describe_errors(error)}\n"
                "Answer again with only the corrected JSON object."
            ),
        ),
    )


def output_retries_used(messages: Sequence[Message]) -> int:
    """How many answers were sent back since the task (counted in the context)."""
    return sum(1 for m in messages if m.role == "user" and m.text.startswith(OUTPUT_RETRY_MARKER))
