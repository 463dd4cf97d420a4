"""``Agent``: a frozen, pure description of one kind of agent."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path, PurePath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from anabranch._thinking_models import accepts_thinking_mode, thinking_always_on
from anabranch.agents._budget import Budget, OnLimit
from anabranch.agents._memory import InstructionLevel, Memory
from anabranch.agents._policy import ContextPolicy
from anabranch.agents._tools import Tool
from anabranch.messages import ModelSettings

__all__ = ["RESERVED_TOOL_NAMES", "Agent"]

RESERVED_TOOL_NAMES = frozenset({"spawn_agent", "recall"})
"""Names of built-in tools the runtime adds; user tools may not take them."""


class Agent(BaseModel):
    """An agent definition: pure data, no I/O. Run it with ``Runtime.run``."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    model: str = Field("claude-sonnet-5-5", min_length=1)
    instructions: str = ""
    description: str = ""
    """One line shown to a supervisor that may spawn this agent."""
    tools: tuple[Tool, ...] = ()
    subagents: tuple[Agent, ...] = ()
    context: ContextPolicy = ContextPolicy()
    max_turns: int = Field(25, gt=0)
    max_tokens: int = Field(4_096, gt=0)
    """Output tokens per model call (thinking included: must exceed the thinking budget)."""
    model_settings: ModelSettings = ModelSettings()
    """Extended thinking, sampling, tool choice and service tier of every call."""
    output_type: type[BaseModel] | None = None
    """A pydantic model the final answer must validate as (``RunResult.output`` is then an
    instance of it; a parent receives its JSON)."""
    output_retries: int = Field(2, ge=0)
    """How many times an answer that fails ``output_type`` goes back to the model."""
    tool_timeout: float | None = Field(120.0, gt=0)
    """Seconds a tool call may take (a tool's own ``timeout`` wins)."""
    timeout: float | None = Field(None, gt=0)
    """Seconds the whole run may take."""
    max_report_tokens: int = Field(2_000, gt=0)
    """Cap on the final report a parent receives from this agent."""
    budget: Budget | None = None
    """Tokens and dollars each run of this agent may spend, its sub-agents' spend included."""
    on_limit: OnLimit = "report"
    """At ``max_turns``, ``timeout`` or a budget: ``report`` ends the run with one final
    model call without tools that reports what it found (marked incomplete); ``fail``
    fails the run."""
    workspace: Path | None = None
    """Folder of bootstrap files; their text enters the dynamic part of the system prompt."""
    bootstrap_files: tuple[str, ...] = ("AGENTS.md", "USER.md", "MEMORY.md")
    """Files (relative to ``workspace``), each in its own tag, in this order."""
    bootstrap_max_chars: int = Field(20_000, gt=0)
    """Characters kept per bootstrap file; a longer file is cut with a visible marker."""
    bootstrap_missing: Literal["skip", "mark"] = "skip"
    """A missing bootstrap file is left out, or shown as an empty tag marked missing."""
    include_date: bool = False
    """Put the current date (``date_format``) in the dynamic part of the system prompt."""
    date_format: str = "%Y-%m-%d"
    include_cwd: bool = False
    """Put the process's working directory in the dynamic part of the system prompt."""
    memory: Memory | None = None
    """Long-term memory: the ``MEMORY.md`` index in the prompt, relevant memories attached
    to the first turn, and the ``remember``/``forget`` (and ``log``) tools."""
    instruction_files: tuple[InstructionLevel, ...] = ()
    """Instruction files from several levels (organization, user, project, local), in the
    dynamic part of the prompt in that order; a later level takes precedence."""

    @field_validator("bootstrap_files")
    @classmethod
    def _relative_files(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            path = PurePath(name)
            if not name.strip() or path.is_absolute() or ".." in path.parts:
                raise ValueError(
                    f"bootstrap file {name!r} must be a path inside the workspace "
                    "(relative, without '..')"
                )
        return value

    @field_validator("instruction_files")
    @classmethod
    def _levels_in_order(cls, value: tuple[InstructionLevel, ...]) -> tuple[InstructionLevel, ...]:
        order = ["organization", "user", "project", "local"]
        ranks = [order.index(level.level) for level in value]
        if ranks != sorted(ranks):
            raise ValueError(
                "instruction_files must be ordered organization, user, project, local "
                "(a later level takes precedence)"
            )
        return value

    @field_validator("output_type", mode="before")
    @classmethod
    def _pydantic_model(cls, value: object) -> object:
        if value is not None and not (isinstance(value, type) and issubclass(value, BaseModel)):
            raise ValueError(f"output_type must be a pydantic BaseModel subclass, not {value!r}")
        return value

    @field_validator("budget")
    @classmethod
    def _budget_per_run(cls, value: Budget | None) -> Budget | None:
        if value is not None and value.per is not None:
            raise ValueError(
                "an agent's budget is per run: per= applies to tenant budgets "
                "(Runtime(budgets={...}))"
            )
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _only_tools(cls, value: object) -> object:
        for item in value if isinstance(value, list | tuple) else ():
            if not isinstance(item, Tool):
                raise ValueError(f"{item!r} is not a Tool; decorate the function with @tool first")
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> Agent:
        names = [t.name for t in self.tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate tool names: {', '.join(duplicates)}")
        reserved = sorted(RESERVED_TOOL_NAMES.intersection(names))
        if reserved:
            raise ValueError(f"tool names reserved for built-in tools: {', '.join(reserved)}")
        if self.memory is not None and not self.memory.read_only:
            memory_tools = {"remember", "forget"} | ({"log"} if self.memory.log else set())
            taken = sorted(memory_tools.intersection(names))
            if taken:
                raise ValueError(
                    f"tool names reserved for memory tools when memory= is set: {', '.join(taken)}"
                )
        budget = self.model_settings.thinking_budget
        if budget is not None and self.max_tokens <= budget:
            raise ValueError(
                f"max_tokens ({self.max_tokens}) must be greater than "
                f"model_settings.thinking_budget ({budget}): thinking tokens count toward "
                "max_tokens"
            )
        _check_thinking_model(self.model, self.model_settings)
        choice = self.model_settings.tool_choice
        if choice not in (None, "auto", "any", "none"):
            offered = {*names, *RESERVED_TOOL_NAMES}
            if choice not in offered:
                raise ValueError(
                    f"model_settings.tool_choice {choice!r} names no tool of this agent "
                    f"(tools: {', '.join(sorted(names)) or 'none'})"
                )
        sub_names = [a.name for a in self.subagents]
        duplicates = sorted({n for n in sub_names if sub_names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate subagent names: {', '.join(duplicates)}")
        return self

    def tool(self, name: str) -> Tool | None:
        """The tool called ``name``, or ``None`` (a dict lookup: the loop asks several times
        per tool call)."""
        tools, by_name, _ = self._tools_by_name
        if tools is not self.tools:  # a ``model_copy`` with other tools kept the old index
            del self.__dict__["_tools_by_name"]
            tools, by_name, _ = self._tools_by_name
        return by_name.get(name)

    def asks_approval(self) -> bool:
        """Whether any of the agent's tools may wait for approval (``needs_approval``): a
        turn of an agent without one has no call to gate (kept with the tool index, once
        per tuple of frozen tools)."""
        tools, _, asking = self._tools_by_name
        if tools is not self.tools:  # (see ``tool``)
            del self.__dict__["_tools_by_name"]
            tools, _, asking = self._tools_by_name
        return asking

    @cached_property
    def _tools_by_name(self) -> tuple[tuple[Tool, ...], dict[str, Tool], bool]:
        by_name: dict[str, Tool] = {}
        for tool in self.tools:
            by_name.setdefault(tool.name, tool)
        asking = any(tool.needs_approval for tool in by_name.values())
        return self.tools, by_name, asking

    def subagent(self, name: str) -> Agent | None:
        return next((a for a in self.subagents if a.name == name), None)


def _check_thinking_model(model: str, settings: ModelSettings) -> None:
    """What ``model``'s family refuses: a budget where only adaptive thinking is accepted,
    adaptive thinking where only a budget is, forced tool use where thinking is always on."""
    mode = settings.thinking
    if mode is not None and not accepts_thinking_mode(model, mode):
        if mode == "enabled":
            raise ValueError(
                f"{model} accepts only adaptive thinking: use "
                "ModelSettings(thinking='adaptive') instead of thinking_budget"
            )
        raise ValueError(
            f"{model} does not support adaptive thinking: use "
            "ModelSettings(thinking_budget=N) instead of thinking='adaptive'"
        )
    if thinking_always_on(model) and settings.forces_tool_use:
        raise ValueError(
            f"{model} always thinks, and thinking may not be combined with "
            f"tool_choice={settings.tool_choice!r} (use 'auto' or 'none')"
        )
