"""A run's prompt: the system blocks and tool list its snapshot freezes (deterministic)."""

from __future__ import annotations

from collections.abc import Sequence

from anabranch._memo import IdentityMemo
from anabranch.agents import Agent
from anabranch.context._cache import breakpoints, place_breakpoints
from anabranch.context._output import output_instructions
from anabranch.context._prompt import SubagentInfo, assemble_system
from anabranch.messages import (
    CacheTTL,
    Message,
    ModelRequest,
    SystemBlock,
    ToolDefinition,
)
from anabranch.runtime._bootstrap import PromptInputs, prompt_inputs
from anabranch.runtime._builtins import BuiltinTool
from anabranch.runtime._history import prompt_json
from anabranch.store import RunRecord

__all__ = ["build_prompt", "run_request", "tool_guidance", "with_breakpoints"]


Prompt = tuple[tuple[SystemBlock, ...], tuple[ToolDefinition, ...]]

_BUILT: IdentityMemo[dict[bool, tuple[PromptInputs, Prompt]]] = IdentityMemo(limit=256)
"""The prompts built for one agent object and one list of built-in tools: for a run and
for a sub-agent's run (``child``), each with the inputs it was built from."""


def build_prompt(agent: Agent, record: RunRecord, builtins: Sequence[BuiltinTool]) -> Prompt:
    """Assemble the system blocks and tool list for this agent (deterministic).

    Reads the bootstrap files, date and cwd now; the result is meant to be snapshotted.
    The prompt depends on nothing else but the agent (frozen), the built-in tools and
    whether the run is a sub-agent's, so a run of the very same agent with the same
    built-ins and inputs as one before gets that one's prompt, without building it
    again. Only anabranch's own built-ins are known to depend on the agent alone: with
    any other, the prompt is built every time.
    """
    inputs = prompt_inputs(agent)
    child = bool(record.parent_run_id or record.task_id)
    if not all(type(b).__module__.startswith("anabranch.") for b in builtins):
        return _build(agent, child, builtins, inputs)
    built = _BUILT.get(((agent,), builtins), _no_prompts)
    found = built.get(child)
    if found is not None and found[0] == inputs:
        return found[1]
    prompt = _build(agent, child, builtins, inputs)
    built[child] = (inputs, prompt)
    return prompt


def _no_prompts(*_groups: object) -> dict[bool, tuple[PromptInputs, Prompt]]:
    return {}


def _build(
    agent: Agent, child: bool, builtins: Sequence[BuiltinTool], inputs: PromptInputs
) -> Prompt:
    ttl = agent.context.cache_ttl
    system = assemble_system(
        instructions=agent.instructions,
        subagents=[
            SubagentInfo(a.name, a.description, a.max_report_tokens) for a in agent.subagents
        ],
        report_cap_tokens=agent.max_report_tokens if child else None,
        cache_ttl=ttl,
        tool_guidance=tool_guidance(agent, builtins),
        bootstrap=inputs.bootstrap,
        bootstrap_max_chars=agent.bootstrap_max_chars,
        bootstrap_missing=agent.bootstrap_missing,
        date=inputs.date,
        cwd=inputs.cwd,
        instruction_files=inputs.instruction_files,
        memory_index=inputs.memory_index,
    )
    definitions = [
        ToolDefinition(name=t.name, description=t.description, input_schema=t.input_schema)
        for t in agent.tools
    ]
    definitions += [b.definition(agent) for b in builtins if b.applies_to(agent)]
    definitions.sort(key=lambda d: d.name)
    if definitions:
        last = definitions[-1]
        definitions[-1] = last.model_copy(update={"cache": ttl})
    return _shared(system, tuple(definitions))


_SHARED_PROMPTS: dict[str, tuple[tuple[SystemBlock, ...], tuple[ToolDefinition, ...]]] = {}
_SHARED_LIMIT = 64


def _shared(
    system: tuple[SystemBlock, ...], tools: tuple[ToolDefinition, ...]
) -> tuple[tuple[SystemBlock, ...], tuple[ToolDefinition, ...]]:
    """An equal prompt built earlier, if there is one: the very same (frozen) blocks.

    A thousand runs of one agent then hold one copy of its system blocks and tool
    definitions instead of a thousand, and what is derived from them by identity (their
    digests, the request fingerprint's prefix) is computed once. Equal means the same
    canonical JSON, the bytes a snapshot stores."""
    system_json, tools_json = prompt_json(system, tools)  # what its snapshot stores, too
    key = f"[{system_json},{tools_json}]"
    found = _SHARED_PROMPTS.get(key)
    if found is not None:
        return found
    _SHARED_PROMPTS[key] = (system, tools)
    while len(_SHARED_PROMPTS) > _SHARED_LIMIT:
        del _SHARED_PROMPTS[next(iter(_SHARED_PROMPTS))]
    return system, tools


def tool_guidance(agent: Agent, builtins: Sequence[BuiltinTool]) -> list[str]:
    """Guidance texts of built-in tools that offer one (an optional ``guidance(agent)``)."""
    texts = []
    for builtin in sorted(builtins, key=lambda b: b.name):
        guidance = getattr(builtin, "guidance", None)
        if builtin.applies_to(agent) and callable(guidance):
            text = guidance(agent)
            if isinstance(text, str) and text.strip():
                texts.append(text)
    if agent.output_type is not None:
        texts.append(output_instructions(agent.output_type))
    return texts


def run_request(
    agent: Agent,
    system: tuple[SystemBlock, ...],
    tools: tuple[ToolDefinition, ...],
    context: Sequence[Message],
    *,
    last_response_id: str | None,
    tool_choice: str | None = None,
    max_tokens: int | None = None,
    placed: bool = False,
) -> ModelRequest:
    """A run's request for ``context`` under its snapshot and the agent's settings
    (``tool_choice`` overrides the agent's). ``placed``: with the cache breakpoints the
    agent's policy places, built as one request (what ``with_breakpoints`` would return)."""
    settings = agent.model_settings
    messages = tuple(context)
    marks: tuple[tuple[int, CacheTTL], ...] = ()
    if placed:
        policy = agent.context
        tools, system, marks = breakpoints(
            tools,
            system,
            messages,
            ttl=policy.cache_ttl if policy.cache_breakpoints else None,
            prefix_ttl=policy.prefix_cache_ttl,
        )
    return ModelRequest._of_valid_parts(  # the run's tuples as they are: no copies
        model=agent.model,
        system=system,
        tools=tools,
        messages=messages,
        max_tokens=max_tokens or agent.max_tokens,
        message_breakpoints=marks,
        settings=settings
        if tool_choice is None
        else settings.model_copy(update={"tool_choice": tool_choice}),
        previous_response_id=last_response_id if settings.cache_diagnostics else None,
    )


def with_breakpoints(agent: Agent, request: ModelRequest) -> ModelRequest:
    """``request`` with cache breakpoints placed by the agent's context policy."""
    policy = agent.context
    return place_breakpoints(
        request,
        ttl=policy.cache_ttl if policy.cache_breakpoints else None,
        prefix_ttl=policy.prefix_cache_ttl,
    )
