"""Long-term memory in a run: the ``remember``/``forget``/``log`` tools, relevant memories
attached to a run's first turn, what a sub-agent inherits, and automatic consolidation.

The files themselves are ``anabranch.memory``'s business; this module only connects them
to runs. Blocking file I/O runs in worker threads.
"""

from __future__ import annotations

import functools
import html
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio.to_thread
import pydantic
from pydantic import BaseModel, ConfigDict, Field

from anabranch.agents import Agent, Memory
from anabranch.errors import ModelError
from anabranch.memory._consolidate import consolidate, consolidation_due, note_session
from anabranch.memory._consolidate_model import consolidate_with_model
from anabranch.memory._extract import ExtractedMemory
from anabranch.memory._files import (
    MemoryFile,
    MemoryFolder,
    MemoryWriteError,
    Provenance,
    append_log,
)
from anabranch.memory._guidance import NEVER_SAVE, TYPE_GUIDANCE
from anabranch.memory._index import capped_index
from anabranch.memory._secrets import find_secret
from anabranch.memory._select import keyword_selection, parse_model_choice, selection_prompt
from anabranch.messages import (
    Message,
    ModelRequest,
    ModelResponse,
    TextBlock,
    ToolDefinition,
    ToolUseBlock,
)
from anabranch.runtime._builtins import ToolOutcome
from anabranch.runtime._environment import Environment
from anabranch.runtime._view import RunView

__all__ = [
    "ForgetTool",
    "LogTool",
    "RememberTool",
    "attach_relevant_memories",
    "choose_memories",
    "inherit_memory",
    "memory_folder",
    "memory_session_start",
    "render_attachment",
]

_log = logging.getLogger(__name__)

GUIDANCE = (
    "You have a long-term memory that lasts beyond this session: a folder of memory files "
    "whose index (MEMORY.md) is in this prompt. Save with `remember` what will still matter "
    "in a later session; remove with `forget` what turned out wrong. Each memory has a type:\n"
    f"{TYPE_GUIDANCE}\n{NEVER_SAVE} Before you save, look in the index for a memory on the "
    "same subject and update it (same name) instead of adding a duplicate. Keep descriptions "
    "to one line: they are the index. A memory you save reaches the index in your prompt at "
    "its next rebuild."
)

LOG_GUIDANCE = (
    "Use `log` for short, dated notes of what happened (decisions, findings, events); "
    "they are kept append-only in daily logs and distilled into memories later."
)


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    schema: dict[str, Any] = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema


class RememberArguments(ExtractedMemory):
    model_config = ConfigDict(extra="forbid")


class ForgetArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="The memory's name, as in the index.")


class LogArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(description="One short note.")


@functools.cache
def _schemas() -> dict[str, dict[str, Any]]:
    return {
        "remember": _schema(RememberArguments),
        "forget": _schema(ForgetArguments),
        "log": _schema(LogArguments),
    }


def _invalid(name: str, exc: pydantic.ValidationError) -> ToolOutcome:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(arguments)'}: {e['msg']}" for e in exc.errors()
    )
    return ToolOutcome(f"Invalid arguments for {name}: {problems}.", is_error=True)


def memory_folder(agent: Agent) -> MemoryFolder:
    memory = agent.memory
    assert memory is not None
    return MemoryFolder(
        memory.folder(agent.name),
        max_file_chars=memory.max_file_chars,
        max_memories=memory.max_memories,
    )


def _writable(agent: Agent) -> bool:
    return agent.memory is not None and not agent.memory.read_only


class RememberTool:
    """``remember``: create or update one typed, provenance-stamped memory file."""

    name = "remember"

    def applies_to(self, agent: Agent) -> bool:
        return _writable(agent)

    def definition(self, agent: Agent) -> ToolDefinition:
        return ToolDefinition(
            name=self.name,
            description="Save (or update, by name) one memory that outlasts this session.",
            input_schema=_schemas()["remember"],
        )

    def guidance(self, agent: Agent) -> str:
        memory = agent.memory
        return GUIDANCE + ("\n" + LOG_GUIDANCE if memory is not None and memory.log else "")

    async def run(self, run: RunView, call: ToolUseBlock) -> ToolOutcome:
        try:
            args = RememberArguments.model_validate(call.input)
        except pydantic.ValidationError as exc:
            return _invalid(self.name, exc)
        secret = find_secret(args.name, args.description, args.content)
        if secret is not None:
            return ToolOutcome(
                f"Not saved: the memory contains what looks like {secret}. Never store "
                "credentials; save where to find them instead, without the secret itself.",
                is_error=True,
            )
        memory = run.agent.memory
        assert memory is not None
        folder = memory_folder(run.agent)
        source = Provenance(
            session_id=run.session_id, run_id=run.id, message_seq=max(run.next_seq - 1, 0)
        )
        try:
            saved, created = await anyio.to_thread.run_sync(
                functools.partial(
                    folder.write,
                    name=args.name,
                    description=args.description,
                    type=args.type,
                    content=args.content,
                    source=source,
                )
            )
        except MemoryWriteError as exc:
            return ToolOutcome(f"Not saved: {exc}.", is_error=True)
        except OSError as exc:
            return ToolOutcome(f"Not saved: the memory folder cannot be written ({exc}).", True)
        verb = "Saved new" if created else "Updated"
        index = await anyio.to_thread.run_sync(folder.index_text) or ""
        view = capped_index(
            index, max_lines=memory.index_max_lines, max_bytes=memory.index_max_bytes
        )
        if view.over_cap:
            return ToolOutcome(
                f"{verb} memory {saved.name!r}, but the index now has {view.lines} lines, over "
                f"its cap ({memory.index_max_lines} lines or {memory.index_max_bytes:,} bytes): "
                "the prompt will not show all of it. Merge related memories or shorten their "
                "descriptions, then forget the redundant ones.",
                is_error=True,
            )
        return ToolOutcome(f"{verb} memory {saved.name!r} ({saved.type}) in {folder.root}.")


class ForgetTool:
    """``forget``: delete one memory file and its index line."""

    name = "forget"

    def applies_to(self, agent: Agent) -> bool:
        return _writable(agent)

    def definition(self, agent: Agent) -> ToolDefinition:
        return ToolDefinition(
            name=self.name,
            description="Delete one memory (by its name in the index).",
            input_schema=_schemas()["forget"],
        )

    async def run(self, run: RunView, call: ToolUseBlock) -> ToolOutcome:
        try:
            args = ForgetArguments.model_validate(call.input)
        except pydantic.ValidationError as exc:
            return _invalid(self.name, exc)
        folder = memory_folder(run.agent)
        try:
            removed = await anyio.to_thread.run_sync(folder.forget, args.name)
        except MemoryWriteError as exc:
            return ToolOutcome(f"Not forgotten: {exc}.", is_error=True)
        if not removed:
            return ToolOutcome(f"There is no memory named {args.name!r}.", is_error=True)
        return ToolOutcome(f"Forgot memory {args.name!r}.")


class LogTool:
    """``log``: append one note to today's append-only log."""

    name = "log"

    def applies_to(self, agent: Agent) -> bool:
        return _writable(agent) and agent.memory is not None and agent.memory.log

    def definition(self, agent: Agent) -> ToolDefinition:
        return ToolDefinition(
            name=self.name,
            description="Append a short note to today's log (append-only, distilled later).",
            input_schema=_schemas()["log"],
        )

    async def run(self, run: RunView, call: ToolUseBlock) -> ToolOutcome:
        try:
            args = LogArguments.model_validate(call.input)
        except pydantic.ValidationError as exc:
            return _invalid(self.name, exc)
        if not args.text.strip():
            return ToolOutcome("Nothing to log: the text is empty.", is_error=True)
        secret = find_secret(args.text)
        if secret is not None:
            return ToolOutcome(f"Not logged: the note contains what looks like {secret}.", True)
        folder = memory_folder(run.agent)
        path = await anyio.to_thread.run_sync(
            functools.partial(append_log, folder.root, args.text, marker=call.id)
        )
        return ToolOutcome(f"Logged to {path.relative_to(folder.root)}.")


# ---------------------------------------------------------------------- selection
def render_attachment(memories: Sequence[MemoryFile]) -> str:
    parts = [
        "<relevant_memories>",
        "Memories from earlier sessions that may help with this task (verify before you "
        "rely on them; they may be out of date):",
    ]
    for m in memories:
        parts.append(
            f'<memory name="{html.escape(m.name)}" type="{m.type}" updated="{m.updated}">\n'
            f"{m.description}\n\n{m.content}\n</memory>"
        )
    parts.append("</relevant_memories>")
    return "\n".join(parts)


async def choose_memories(
    call: Callable[[ModelRequest], Awaitable[ModelResponse]],
    memory: Memory,
    task: str,
    candidates: list[MemoryFile],
) -> tuple[list[str], str]:
    """The names of the candidates relevant to ``task``, and how they were chosen: by
    ``memory.select_model`` (one ``call``), or by keyword overlap when there is none or
    it fails."""
    if memory.select_model is None:
        return keyword_selection(task, candidates, memory.select), "keywords"
    request = ModelRequest(
        model=memory.select_model,
        messages=(Message.user(selection_prompt(task, candidates, memory.select)),),
        max_tokens=512,
    )
    try:
        response = await call(request)
        return parse_model_choice(response.to_message().text, candidates, memory.select), "model"
    except (ModelError, ValueError) as exc:
        _log.info("memory selection by %s failed (%s); keyword overlap instead", request.model, exc)
        reason = " ".join(str(exc).split())[:120]
        return keyword_selection(task, candidates, memory.select), f"keywords (model: {reason})"


def _task_text(messages: Sequence[Message]) -> str:
    for message in reversed(messages):
        if message.role == "user":
            return message.text
    return ""


async def attach_relevant_memories(
    env: Environment, agent: Agent, messages: list[Message]
) -> list[Message]:
    """``messages`` with up to ``memory.select`` relevant memories attached to the last user
    turn (never to the system prompt, so the cached prefix does not change)."""
    memory = agent.memory
    if memory is None or memory.select == 0 or not messages or messages[-1].role != "user":
        return messages
    folder = memory_folder(agent)
    everything = await anyio.to_thread.run_sync(folder.all)
    candidates = everything[: memory.select_candidates]
    if not candidates:
        return messages
    task = _task_text(messages)
    with env.tracing.memory_span("select", agent=agent.name, session_id=env.session_id) as span:
        chosen, method = await choose_memories(env.model.request, memory, task, candidates)
        env.tracing.memory_result(
            span,
            {
                "considered": len(candidates),
                "considered_names": [m.name for m in candidates],
                "chosen": list(chosen),
                "method": method,
            },
        )
    if not chosen:
        return messages
    by_name = {m.name: m for m in candidates}
    attachment = TextBlock(text=render_attachment([by_name[n] for n in chosen]))
    last = messages[-1]
    return [*messages[:-1], Message(role="user", content=(*last.content, attachment))]


def inherit_memory(parent: Agent, child: Agent) -> Agent:
    """A sub-agent without its own memory reads its parent's, read-only and without the
    index in its prompt (unless the parent's memory says ``children="none"``)."""
    memory = parent.memory
    if child.memory is not None or memory is None or memory.children != "read":
        return child
    inherited = memory.model_copy(
        update={
            "dir": memory.folder(parent.name),
            "scope": "shared",
            "read_only": True,
            "index_in_prompt": False,
            "log": False,
            "auto_consolidate": False,
        }
    )
    return child.model_copy(update={"memory": inherited})


async def memory_session_start(env: Environment, agent: Agent) -> None:
    """Count the session for the root agent's memory and consolidate when it is due."""
    memory = agent.memory
    if memory is None or memory.read_only or not memory.auto_consolidate:
        return
    root = memory.folder(agent.name)
    try:
        await anyio.to_thread.run_sync(note_session, root)
        if not await anyio.to_thread.run_sync(consolidation_due, root):
            return
        with env.tracing.memory_span(
            "consolidate", agent=agent.name, session_id=env.session_id
        ) as span:
            if memory.consolidate_model is not None:
                report = await consolidate_with_model(
                    root,
                    model=env.model,
                    model_name=memory.consolidate_model,
                    retention_days=memory.retention_days,
                )
            else:
                report = await anyio.to_thread.run_sync(
                    functools.partial(consolidate, root, retention_days=memory.retention_days)
                )
            env.tracing.memory_result(
                span,
                {
                    "method": report.method,
                    "merged": [kept for kept, _ in report.merged],
                    "distilled": report.distilled,
                    "pruned": report.pruned,
                },
            )
    except OSError as exc:
        _log.warning("memory consolidation in %s skipped: %s", root, exc)
