"""A tool's arguments: those a plain schema takes unchanged skip pydantic, and every call
still gets exactly what pydantic's validation gives (values, types, and errors)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

import pydantic
import pytest
from pydantic import Field

from anabranch import Agent, Tool, tool
from anabranch.messages import ToolUseBlock
from anabranch.runtime._tool_exec import run_user_tool


@tool
async def plain(
    text: str,
    count: int = 3,
    ratio: float = 0.5,
    flag: bool = False,
    label: Optional[str] = None,  # noqa: UP045 (the typing spelling is checked too)
    limit: int | None = None,
) -> str:
    """Plain scalars only."""
    return text


@tool
async def constrained(text: Annotated[str, Field(max_length=3)], mode: Literal["a", "b"]) -> str:
    """Constraints and literals: always validated by pydantic."""
    return text


@tool
async def nested(points: list[int], extra: dict[str, int] | None = None) -> str:
    """Containers: always validated by pydantic."""
    return ""


ARGUMENTS: list[dict[str, Any]] = [
    {"text": "x"},
    {"text": "x", "count": 7, "ratio": 2.5, "flag": True, "label": "l", "limit": None},
    {"text": "x", "count": 2.0},  # a float pydantic turns into an int
    {"text": "x", "ratio": 2},  # an int pydantic turns into a float
    {"text": "x", "count": True},  # a bool for an int
    {"text": "x", "flag": 1},
    {"text": "x", "label": 5},
    {"text": "x", "limit": "5"},
    {"text": 5},
    {},
    {"count": 1},
    {"text": "x", "unknown": 1},
    {"text": "x", "count": None},
    {"text": "abcd", "mode": "c"},
    {"text": "ab", "mode": "a"},
    {"points": [1, "2"]},
    {"points": [1], "extra": {"a": 1}},
    {"points": "nope"},
]


def _by_pydantic(function: Tool, arguments: dict[str, Any]) -> dict[str, Any] | str:
    try:
        parsed = function.args_model.model_validate(arguments)
    except pydantic.ValidationError as exc:
        return str(exc.errors(include_url=False))
    return {name: getattr(parsed, name) for name in type(parsed).model_fields}


def _by_tool(function: Tool, arguments: dict[str, Any]) -> dict[str, Any] | str:
    try:
        return function.validate_arguments(arguments)
    except pydantic.ValidationError as exc:
        return str(exc.errors(include_url=False))


@pytest.mark.parametrize("function", [plain, constrained, nested], ids=lambda t: t.name)
@pytest.mark.parametrize("arguments", ARGUMENTS)
def test_arguments_are_what_pydantic_makes_of_them(
    function: Tool, arguments: dict[str, Any]
) -> None:
    expected, got = _by_pydantic(function, arguments), _by_tool(function, arguments)
    assert got == expected
    if isinstance(expected, dict):
        assert isinstance(got, dict)
        assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in expected.items()}
        assert list(got) == list(expected)


def test_a_deep_copied_tool_still_requires_its_arguments() -> None:
    """``Agent.model_copy(deep=True)`` copies its tools and what they cached."""
    assert plain.validate_arguments({"text": "x"})["text"] == "x"  # fields cached
    agent = Agent(name="a", instructions="i", tools=[plain]).model_copy(deep=True)
    copied = agent.tool("plain")
    assert copied is not None and copied is not plain
    assert _by_tool(copied, {}) == _by_pydantic(plain, {})
    assert _by_tool(copied, {"text": "x"}) == _by_pydantic(plain, {"text": "x"})


def test_a_default_pydantic_validates_is_validated() -> None:
    class Defaulted(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        count: int = Field("3", validate_default=True)

    defaulted = Tool(
        name="d", description="d", function=plain.function, input_schema={}, args_model=Defaulted
    )
    assert defaulted._plain_fields is None
    assert defaulted.validate_arguments({}) == {"count": 3}


def test_only_plain_schemas_skip_pydantic() -> None:
    assert plain._plain_fields is not None
    assert constrained._plain_fields is None
    assert nested._plain_fields is None


def test_a_model_with_a_validator_is_always_validated() -> None:
    class Shouting(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        text: str

        @pydantic.field_validator("text")
        @classmethod
        def upper(cls, value: str) -> str:
            return value.upper()

    shouting = Tool(
        name="shout", description="d", function=plain.function, input_schema={}, args_model=Shouting
    )
    assert shouting._plain_fields is None
    assert shouting.validate_arguments({"text": "hi"}) == {"text": "HI"}


@pytest.mark.anyio
async def test_the_model_sees_the_same_error_for_bad_arguments() -> None:
    use = ToolUseBlock(id="toolu_1", name="plain", input={"text": 5, "unknown": 1})
    outcome = await run_user_tool(
        plain, use, session_id="s", run_id="r", agent_name="a", default_timeout=None
    )
    assert outcome.is_error
    assert outcome.content == (
        "Invalid arguments for tool 'plain': text: Input should be a valid string; "
        "unknown: Extra inputs are not permitted. Fix the arguments and retry."
    )
