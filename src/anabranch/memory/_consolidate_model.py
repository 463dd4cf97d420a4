"""Model-written consolidation: one request in which a model merges overlapping memories
and distills the finished daily logs into topic memories.

The model is made to call one tool, ``consolidate_memories`` (``tool_choice``), so its
plan arrives as a typed ``tool_use`` input. The plan is checked before anything changes:
every merge names at least two existing memories, none twice; names are sanitized; types,
sizes and the credential patterns are checked like a ``remember`` call. A plan that fails
any check, a failed call, or a folder too large for one request falls back to the
deterministic ``consolidate`` (the report's ``method`` says which path ran and why).
Originals a model rewrote are kept under ``logs/archive/``, so nothing is lost to a bad
merge. Pruning, the state file and the change summary are shared with the
deterministic path.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import anyio.to_thread
import pydantic
from pydantic import BaseModel, ConfigDict

from anabranch.errors import ModelError
from anabranch.memory._consolidate import (
    ConsolidationReport,
    consolidate,
    finish,
    pending_logs,
    read_state,
)
from anabranch.memory._files import (
    MemoryFile,
    MemoryFolder,
    MemoryWriteError,
    merged_lines,
    now_iso,
    sanitize_name,
)
from anabranch.memory._guidance import NEVER_SAVE, TYPE_GUIDANCE
from anabranch.memory._secrets import find_secret
from anabranch.messages import (
    Message,
    ModelRequest,
    ModelResponse,
    ModelSettings,
    SystemBlock,
    ToolDefinition,
)

__all__ = ["CONSOLIDATE_TOOL", "ModelRequester", "consolidate_with_model"]

CONSOLIDATE_TOOL = "consolidate_memories"
MAX_PROMPT_CHARS = 150_000
"""Memories and logs larger than this do not fit one request: the deterministic path runs."""

_SYSTEM = (
    "You consolidate an agent's long-term memory: typed memory files that outlast its "
    "sessions, and append-only daily logs. Call consolidate_memories with: merges, each "
    "joining two or more memories about the same subject into one (where they disagree, "
    "the most recently updated wins; say in the content what changed), and distilled, "
    "the durable facts of the logs as topic memories. Leave alone what does not overlap. "
    f"Each memory has a type:\n{TYPE_GUIDANCE}\n{NEVER_SAVE} Names are short kebab-case; "
    "descriptions are one line (the index line)."
)


class ModelRequester(Protocol):
    """Anything that answers a ``ModelRequest`` (an ``anabranch.Model``)."""

    async def request(self, request: ModelRequest) -> ModelResponse: ...


MemoryKind = Literal["user", "feedback", "project", "reference"]


class _Memory(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    description: str
    type: MemoryKind
    content: str


class _Merge(_Memory):
    names: list[str]
    """The existing memories this one replaces."""


class _Plan(BaseModel):
    model_config = ConfigDict(extra="ignore")

    merges: list[_Merge] = []
    distilled: list[_Memory] = []


def _tool() -> ToolDefinition:
    schema: dict[str, Any] = _Plan.model_json_schema()
    return ToolDefinition(
        name=CONSOLIDATE_TOOL,
        description="Merge overlapping memories and distill the daily logs.",
        input_schema=schema,
    )


def _payload(memories: Sequence[MemoryFile], logs: dict[str, list[str]]) -> str:
    return json.dumps(
        {
            "memories": [
                {
                    "name": m.name,
                    "type": m.type,
                    "updated": m.updated,
                    "description": m.description,
                    "content": m.content,
                }
                for m in memories
            ],
            "logs": logs,
        },
        ensure_ascii=False,
        indent=1,
    )


def consolidation_request(model: str, payload: str) -> ModelRequest:
    return ModelRequest(
        model=model,
        system=(SystemBlock(text=_SYSTEM),),
        tools=(_tool(),),
        messages=(Message.user("The memories (newest first) and the daily logs:\n" + payload),),
        max_tokens=8192,
        settings=ModelSettings(tool_choice=CONSOLIDATE_TOOL),
    )


def _checked(item: _Memory, max_chars: int) -> tuple[str, str]:
    name = sanitize_name(item.name)
    description = " ".join(item.description.split())
    if not description or len(description) > 300:
        raise MemoryWriteError(f"{name}: the description must be one line under 300 characters")
    if not item.content.strip() or len(item.content) > max_chars:
        raise MemoryWriteError(f"{name}: the content must be 1 to {max_chars:,} characters")
    secret = find_secret(item.name, item.description, item.content)
    if secret is not None:
        raise MemoryWriteError(f"{name}: the content looks like {secret}")
    return name, description


def _apply_plan(
    plan: _Plan, memories: Sequence[MemoryFile], folder: MemoryFolder, report: ConsolidationReport
) -> tuple[list[MemoryFile], list[str], list[MemoryFile]]:
    """The writes, removals and archived originals of a valid plan (``MemoryWriteError``
    when it is not valid: then nothing of it is used)."""
    by_name = {m.name: m for m in memories}
    writes: list[MemoryFile] = []
    removed: list[str] = []
    archive: list[MemoryFile] = []
    taken: set[str] = set()
    stamp = now_iso()
    for merge in plan.merges:
        names = list(dict.fromkeys(merge.names))
        unknown = [n for n in names if n not in by_name]
        if unknown or len(names) < 2:
            raise MemoryWriteError(f"a merge must name two or more memories (unknown: {unknown})")
        if taken & set(names):
            raise MemoryWriteError(f"a memory is merged twice: {sorted(taken & set(names))}")
        taken.update(names)
        name, description = _checked(merge, folder.max_file_chars)
        if name in by_name and name not in names:
            raise MemoryWriteError(f"merge target {name!r} is another existing memory")
        group = sorted((by_name[n] for n in names), key=lambda m: m.updated, reverse=True)
        writes.append(
            MemoryFile(
                name=name,
                description=description,
                type=merge.type,
                content=merge.content.strip("\n"),
                created=min(m.created for m in group),
                updated=stamp,
                source=group[0].source,
            )
        )
        archive += group
        removed += [n for n in names if n != name]
        report.merged.append((name, [n for n in names if n != name]))
    for item in plan.distilled:
        name, description = _checked(item, folder.max_file_chars)
        if name in taken or any(w.name == name for w in writes):
            raise MemoryWriteError(f"distilled memory {name!r} is also merged")
        previous = by_name.get(name)
        content = item.content.strip("\n")
        if previous is not None:  # an existing topic gains the new lines
            content = merged_lines(previous.content, content)
            archive.append(previous)
        writes.append(
            MemoryFile(
                name=name,
                description=description,
                type=item.type,
                content=content,
                created=previous.created if previous else stamp,
                updated=stamp,
            )
        )
        report.distilled.append(name)
    return writes, removed, archive


async def consolidate_with_model(
    root: Path,
    *,
    model: ModelRequester,
    model_name: str,
    retention_days: int | None = None,
    now: dt.datetime | None = None,
) -> ConsolidationReport:
    """Consolidate ``root`` with one request to ``model_name`` (through ``model``); the
    deterministic ``consolidate`` when the request fails or its plan is not valid."""
    moment = now or dt.datetime.now(dt.UTC)
    folder = MemoryFolder(root)
    memories = await anyio.to_thread.run_sync(folder.all)
    state = await anyio.to_thread.run_sync(read_state, root)
    logs, consumed = await anyio.to_thread.run_sync(pending_logs, folder, state, moment.date())
    payload = _payload(memories, logs)
    failure: str
    if len(payload) > MAX_PROMPT_CHARS:
        failure = f"{len(payload):,} characters do not fit one request"
    else:
        try:
            response = await model.request(consolidation_request(model_name, payload))
            uses = [u for u in response.to_message().tool_uses if u.name == CONSOLIDATE_TOOL]
            if not uses:
                raise ValueError("the model did not call consolidate_memories")
            plan = _Plan.model_validate(uses[0].input)
            report = ConsolidationReport(
                when=moment.replace(microsecond=0).isoformat(), method=f"model {model_name}"
            )
            writes, removed, archive = _apply_plan(plan, memories, folder, report)
        except (ModelError, ValueError) as exc:  # pydantic and MemoryWriteError are ValueErrors
            kind = "invalid plan" if isinstance(exc, pydantic.ValidationError) else ""
            failure = kind or " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        else:
            await anyio.to_thread.run_sync(
                functools.partial(
                    finish,
                    folder,
                    report,
                    writes,
                    removed,
                    consumed,
                    retention_days=retention_days,
                    now=moment,
                    archive=archive,
                )
            )
            return report
    method = f"deterministic (model {model_name} failed: {failure})"
    return await anyio.to_thread.run_sync(
        functools.partial(
            consolidate, root, retention_days=retention_days, now=moment, method=method
        )
    )
