"""Agent, ContextPolicy and @tool: schemas from signatures, clear errors for bad input."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field, ValidationError

from anabranch import Agent, ContextPolicy, ToolContext, tool
from anabranch.errors import ToolDefinitionError


class Point(BaseModel):
    x: int
    y: int


@tool
async def lookup(
    topic: Annotated[str, Field(description="What to look up")],
    limit: int = 3,
    mode: Literal["fast", "deep"] = "fast",
    ctx: ToolContext | None = None,
) -> str:
    """Look a topic up in the notes.

    Args:
        limit: How many results to return.
    """
    return topic


def test_schema_comes_from_type_hints_and_docstring() -> None:
    schema = lookup.input_schema
    assert lookup.name == "lookup"
    assert lookup.description == "Look a topic up in the notes."
    assert schema["type"] == "object"
    assert schema["required"] == ["topic"]
    assert schema["properties"]["topic"] == {"type": "string", "description": "What to look up"}
    assert schema["properties"]["limit"]["description"] == "How many results to return."
    assert schema["properties"]["mode"]["enum"] == ["fast", "deep"]
    assert schema["additionalProperties"] is False


def test_tool_context_is_injected_not_described() -> None:
    @tool
    def stamp(text: str, ctx: ToolContext) -> str:
        """Stamp a text."""
        return text

    assert stamp.context_param == "ctx"
    assert "ctx" not in stamp.input_schema["properties"]
    assert not stamp.is_async


def test_nested_models_are_described() -> None:
    @tool
    def plot(points: list[Point], title: str = "") -> int:
        """Plot points."""
        return len(points)

    assert "$defs" in plot.input_schema
    assert plot.validate_arguments({"points": [{"x": 1, "y": 2}]})["points"][0] == Point(x=1, y=2)
    with pytest.raises(ValidationError):
        plot.validate_arguments({"points": [{"x": "not a number", "y": 2}]})
    with pytest.raises(ValidationError):
        plot.validate_arguments({"points": [], "unexpected": 1})


def test_explicit_name_description_and_interrupt_policy() -> None:
    @tool(name="pay-invoice", description="Pay one invoice.", on_interrupt="report", timeout=5)
    async def pay(invoice_id: str) -> str:
        return invoice_id

    assert (pay.name, pay.description, pay.on_interrupt, pay.timeout) == (
        "pay-invoice",
        "Pay one invoice.",
        "report",
        5,
    )


def test_signatures_that_cannot_become_schemas_fail_at_decoration() -> None:
    with pytest.raises(ToolDefinitionError, match="needs a type annotation"):

        @tool
        def untyped(x) -> str:  # type: ignore[no-untyped-def]
            """Untyped."""
            return ""

    with pytest.raises(ToolDefinitionError, match=r"\*args"):

        @tool
        def variadic(*names: str) -> str:
            """Variadic."""
            return ""

    with pytest.raises(ToolDefinitionError, match="JSON schema"):

        @tool
        def opaque(handle: object, sock: Any = None, cb: type[int] = int) -> str:
            """Takes a class object, which has no JSON schema."""
            return ""

    with pytest.raises(ToolDefinitionError, match="needs a description"):

        @tool
        def undocumented(x: int) -> int:
            return x

    with pytest.raises(ToolDefinitionError, match="on_interrupt"):
        tool(on_interrupt="sometimes")  # type: ignore[call-overload]


def _field_of(error: ValidationError) -> set[str]:
    return {".".join(str(p) for p in e["loc"]) for e in error.errors()}


def test_invalid_agents_name_the_field() -> None:
    with pytest.raises(ValidationError) as empty:
        Agent(name="", model="m")
    assert "name" in _field_of(empty.value)

    with pytest.raises(ValidationError) as unknown:
        Agent(name="a", model="m", temperature=0.2)  # type: ignore[call-arg]
    assert "temperature" in _field_of(unknown.value)

    with pytest.raises(ValidationError) as window:
        Agent(name="a", model="m", context=ContextPolicy(window=0))
    assert "window" in _field_of(window.value)

    with pytest.raises(ValidationError, match="duplicate tool names: lookup"):
        Agent(name="a", model="m", tools=[lookup, lookup])

    with pytest.raises(ValidationError, match="not a Tool"):
        Agent(name="a", model="m", tools=[print])

    child = Agent(name="child", model="m")
    with pytest.raises(ValidationError, match="duplicate subagent names: child"):
        Agent(name="a", model="m", subagents=[child, child])

    with pytest.raises(ValidationError, match="output_reserve"):
        ContextPolicy(window=1000, output_reserve=1000)


def test_reserved_builtin_names_cannot_be_taken() -> None:
    @tool(name="spawn_agent")
    def fake(x: int) -> int:
        """Pretend to spawn."""
        return x

    with pytest.raises(ValidationError, match="reserved"):
        Agent(name="a", model="m", tools=[fake])


def test_agents_are_frozen() -> None:
    agent = Agent(name="a", model="m")
    with pytest.raises(ValidationError):
        agent.name = "b"  # type: ignore[misc]


def test_threshold_respects_output_reserve() -> None:
    assert ContextPolicy(window=10_000, compact_at=0.5).threshold == 5_000
    assert ContextPolicy(window=10_000, compact_at=1.0, output_reserve=2_000).threshold == 8_000


def test_the_output_reserve_scales_with_a_small_window() -> None:
    """Before: ``ContextPolicy(window=3000)`` was refused over an undocumented 4,096 reserve."""
    small = ContextPolicy(window=3000)
    assert small.reserve == 375 and small.threshold == 2100
    assert ContextPolicy(window=64_000).reserve == 4096
    assert ContextPolicy(window=3000, output_reserve=200).threshold == 2100


def test_every_example_sub_agent_has_a_description() -> None:
    """Supervisors list their sub-agents by description; the examples must set one."""
    from pathlib import Path

    from anabranch.runtime._loader import load_object

    examples = Path(__file__).resolve().parents[1] / "examples"
    found = []
    for path in sorted(examples.glob("*.py")):
        for name in ("supervisor", "graph"):
            try:
                root = load_object(f"{path}:{name}")
            except Exception:
                continue
            agents = [t.agent for t in root.tasks] if hasattr(root, "tasks") else [root]
            stack = list(agents)
            while stack:
                agent = stack.pop()
                stack.extend(agent.subagents)
                for sub in agent.subagents:
                    found.append((path.name, sub.name, sub.description))
    assert found
    assert [f for f in found if not f[2]] == []
