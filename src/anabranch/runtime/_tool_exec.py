"""Running user tools: validate, inject ``ToolContext``, enforce timeouts, never crash."""

from __future__ import annotations

import functools
import logging
from typing import Any

import anyio
import anyio.to_thread
import pydantic
from pydantic_core import to_json

from anabranch.agents import Tool, ToolContext
from anabranch.messages import Document, Image, ToolUseBlock
from anabranch.runtime._builtins import ToolOutcome

__all__ = ["render_outcome", "render_output", "run_user_tool"]

_log = logging.getLogger("anabranch.tool")


def render_output(value: Any) -> str:
    """A tool's return value as the text the model sees."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return to_json(value, fallback=str).decode()


def render_outcome(value: Any) -> ToolOutcome:
    """A tool's return value as what the model sees: an ``Image`` or ``Document``, or a list
    of strings, images and documents (text first, then the attachments, in order), or any
    other value as text."""
    if isinstance(value, Image | Document):
        return ToolOutcome("", attachments=(value,))
    if isinstance(value, list | tuple) and any(isinstance(v, Image | Document) for v in value):
        texts = [render_output(v) for v in value if not isinstance(v, Image | Document)]
        attachments = tuple(v for v in value if isinstance(v, Image | Document))
        return ToolOutcome("\n".join(t for t in texts if t), attachments=attachments)
    return ToolOutcome(render_output(value))


def _validation_message(tool: Tool, exc: pydantic.ValidationError) -> str:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '(arguments)'}: {err['msg']}"
        for err in exc.errors()
    )
    return f"Invalid arguments for tool {tool.name!r}: {problems}. Fix the arguments and retry."


async def run_user_tool(
    tool: Tool,
    call: ToolUseBlock,
    *,
    session_id: str,
    run_id: str,
    agent_name: str,
    default_timeout: float | None,
) -> ToolOutcome:
    """Run one tool call. Invalid arguments, exceptions and timeouts become error outcomes."""
    try:
        kwargs = tool.validate_arguments(call.input)
    except pydantic.ValidationError as exc:
        return ToolOutcome(_validation_message(tool, exc), is_error=True)
    if tool.context_param:
        kwargs[tool.context_param] = ToolContext(
            call_id=call.id,
            session_id=session_id,
            run_id=run_id,
            agent_name=agent_name,
            logger=logging.LoggerAdapter(
                _log, {"call_id": call.id, "run_id": run_id, "tool": tool.name}
            ),
        )
    timeout = tool.timeout if tool.timeout is not None else default_timeout
    try:
        with anyio.fail_after(timeout):
            if tool.is_async:
                value = await tool.function(**kwargs)
            else:
                value = await anyio.to_thread.run_sync(
                    functools.partial(tool.function, **kwargs), abandon_on_cancel=True
                )
    except TimeoutError:
        return ToolOutcome(f"Tool {tool.name!r} timed out after {timeout} seconds.", is_error=True)
    except Exception as exc:
        _log.info("tool %s raised %r", tool.name, exc)
        return ToolOutcome(f"Tool {tool.name!r} failed: {type(exc).__name__}: {exc}", True)
    try:
        return render_outcome(value)
    except Exception as exc:
        return ToolOutcome(f"Tool {tool.name!r} returned an unserializable value: {exc}", True)
