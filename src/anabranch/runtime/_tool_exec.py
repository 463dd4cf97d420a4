"""Running user tools: validate, inject ``ToolContext``, enforce timeouts, never crash.

Whatever a tool raises is that tool's failure, an ``is_error`` result the model sees: any
``Exception``, and also ``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit``, a
``CancelledError`` the tool raised itself (a cancelled inner task) and any other
``BaseException``. The one exception is a cancellation *of the run* (a user's Ctrl-C, a
cancelled scope around the run, a timeout of the run): it propagates and leaves the session
resumable. A sync tool runs in a daemon thread; one that outlives its timeout is abandoned
and never keeps the process alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import dis
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Generator
from contextlib import AbstractContextManager
from types import CodeType
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import pydantic
from pydantic_core import to_json

from anabranch.agents import Tool, ToolContext
from anabranch.messages import Document, Image, ToolUseBlock, valid_json
from anabranch.runtime._builtins import ToolOutcome

__all__ = ["render_outcome", "render_output", "run_user_tool"]

_log = logging.getLogger("anabranch.tool")

_NO_LIMIT: AbstractContextManager[object] = contextlib.nullcontext()
"""Around a call without a timeout (no cancel scope to build for it)."""


def render_output(value: Any) -> str:
    """A tool's return value as the text the model sees."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return to_json(valid_json(value), fallback=str).decode()


def render_outcome(value: Any) -> ToolOutcome:
    """A tool's return value as what the model sees: an ``Image`` or ``Document``, or a list
    of strings, images and documents (text first, then the attachments, in order), or any
    other value as text."""
    if type(value) is str:  # the usual answer
        return ToolOutcome(value)
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
    cancel_scope: Callable[[], anyio.CancelScope] = anyio.CancelScope,
) -> ToolOutcome:
    """Run one tool call. Invalid arguments, exceptions and timeouts become error outcomes.

    ``cancel_scope`` makes the scope a timeout needs: the event loop's ``CancelScope``
    class spares anyio's lookup of the loop per call.
    """
    try:
        kwargs = tool.validate_arguments(call.input)
    except pydantic.ValidationError as exc:
        return ToolOutcome(_validation_message(tool, exc), is_error=True)
    context = None
    if tool.context_param:
        kwargs[tool.context_param] = context = ToolContext(
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
        if not tool.is_async:
            with _NO_LIMIT if timeout is None else anyio.fail_after(timeout):
                value = await run_in_daemon_thread(functools.partial(tool.function, **kwargs))
        elif timeout is None or never_waits(tool.function):  # (no deadline could apply)
            value = await tool.function(**kwargs)
        else:
            with cancel_scope() as scope:  # entered first: the tool's own scopes nest in it
                started = time.monotonic()
                coroutine = tool.function(**kwargs)
                try:
                    step = coroutine.send(None)  # the tool's first step, up to its first wait
                except StopIteration as done:  # returned without waiting: no deadline armed
                    value = done.value
                else:  # it waits: from now its deadline applies, counted from its start
                    scope.deadline = anyio.current_time() + timeout - (time.monotonic() - started)
                    value = await _Resumed(coroutine, step)
            if scope.cancelled_caught:  # only the deadline cancels this scope
                raise TimeoutError
    except TimeoutError:
        return ToolOutcome(f"Tool {tool.name!r} timed out after {timeout} seconds.", is_error=True)
    except anyio.get_cancelled_exc_class() as exc:
        if await _run_is_cancelled():
            raise
        return _failure(tool, exc, "raised by the tool, not a cancellation of the run")
    except Exception as exc:
        return _failure(tool, exc)
    except BaseException as exc:  # KeyboardInterrupt, SystemExit, GeneratorExit, custom ones
        return _failure(tool, exc, "raised by the tool")
    try:
        outcome = render_outcome(value)
    except Exception as exc:
        return ToolOutcome(f"Tool {tool.name!r} returned an unserializable value: {exc}", True)
    if context is not None and context.pins:  # pins count once the call succeeded
        outcome = dataclasses.replace(outcome, pins=tuple(context.pins))
    return outcome


_WAITS = frozenset({"SEND", "YIELD_VALUE", "YIELD_FROM"})
"""What ``await``, ``async for`` and ``async with`` compile to: a coroutine's suspensions."""
_NEVER_WAITS: dict[CodeType, bool] = {}
"""``never_waits`` by code object (a tool's function is called again and again)."""
NEVER_WAITS_KEPT = 1024


def never_waits(function: Callable[..., Any]) -> bool:
    """Whether ``function`` is an ``async def`` whose own code cannot suspend (no
    ``await``, ``async for`` or ``async with`` in it: what it calls is plain code), so the
    coroutine it returns finishes or raises in its first step, before any deadline could
    apply: it needs no cancel scope to hold one. ``False`` whenever that is not certain
    (anything but a plain coroutine function)."""
    code = getattr(function, "__code__", None)
    if type(code) is not CodeType or not code.co_flags & inspect.CO_COROUTINE:
        return False
    known = _NEVER_WAITS.get(code)
    if known is None:
        known = not any(i.opname in _WAITS for i in dis.get_instructions(code))
        if len(_NEVER_WAITS) >= NEVER_WAITS_KEPT:
            _NEVER_WAITS.clear()
        _NEVER_WAITS[code] = known
    return known


class _Resumed:
    """Awaits a coroutine whose first step already ran (and yielded ``step``), as
    ``await`` would have: what it yields goes to the event loop as is, and what the loop
    sends or throws back goes to it.

    A timeout uses this so that a tool that returns without waiting arms no timer (nor
    reads the loop's clock): its first step runs inside a cancel scope without a deadline,
    which is set only if the tool waits.
    """

    __slots__ = ("coroutine", "step")

    def __init__(self, coroutine: Coroutine[Any, Any, Any], step: Any) -> None:
        self.coroutine, self.step = coroutine, step

    def __await__(self) -> Generator[Any, Any, Any]:
        coroutine, step = self.coroutine, self.step
        self.step = None  # the loop holds what it waits on
        while True:
            try:
                sent = yield step
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as exc:  # a cancellation, or whatever the loop throws in
                try:
                    step = coroutine.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    step = coroutine.send(sent)
                except StopIteration as done:
                    return done.value


def _failure(tool: Tool, exc: BaseException, note: str = "") -> ToolOutcome:
    _log.info("tool %s raised %r", tool.name, exc)
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    suffix = f" ({note})" if note else ""
    return ToolOutcome(f"Tool {tool.name!r} failed: {detail}{suffix}", is_error=True)


async def _run_is_cancelled() -> bool:
    """Whether the caller itself is being cancelled (rather than a tool raising the class).

    anyio's cancellation is level-triggered: a checkpoint in a cancelled scope raises again.
    A plain ``task.cancel()`` on asyncio (``asyncio.run`` on Ctrl-C) shows as a pending
    cancellation request on the task instead.
    """
    try:
        task = asyncio.current_task()
    except RuntimeError:  # not on asyncio
        task = None
    if task is not None and task.cancelling():
        return True
    try:
        await anyio.lowlevel.checkpoint()
    except anyio.get_cancelled_exc_class():
        return True
    return False


async def run_in_daemon_thread(function: Callable[[], Any]) -> Any:
    """Call ``function`` in a new daemon thread and wait for it (cancellable).

    anyio's worker threads are not daemons, so a sync tool still blocked after its timeout
    would keep the interpreter from exiting. This thread is abandoned on cancellation and
    dies with the process. Threads count against anyio's default thread limiter while
    awaited, as ``anyio.to_thread.run_sync`` does.
    """
    done = anyio.Event()
    result: list[tuple[bool, Any]] = []
    token = anyio.lowlevel.current_token()
    context = contextvars.copy_context()

    def work() -> None:
        try:
            result.append((True, context.run(function)))
        except BaseException as exc:  # handed to the awaiting task
            result.append((False, exc))
        try:
            anyio.from_thread.run_sync(done.set, token=token)
        except Exception:  # the event loop is gone: the call was abandoned
            pass

    async with anyio.to_thread.current_default_thread_limiter():
        threading.Thread(target=work, name="anabranch sync tool", daemon=True).start()
        await done.wait()
    ok, value = result[0]
    if ok:
        return value
    raise value
