"""``@tool``: typed Python functions become tools the model can call."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, overload

import pydantic
from pydantic import BaseModel, ConfigDict

from anabranch.errors import ToolDefinitionError

__all__ = ["OnInterrupt", "Pin", "Tool", "ToolContext", "tool"]

OnInterrupt = Literal["retry", "report"]
NeedsApproval = bool | Callable[[dict[str, Any]], bool]
"""``True``: every call waits for a person; a function: decides per call from its arguments."""
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


PIN_LABEL_CHARS = 80
"""Longest pin label kept (the note of over-cap pins names each one by it)."""


@dataclass(frozen=True)
class Pin:
    """Something a tool pinned: re-attached to the agent's context after each compaction."""

    text: str
    label: str


@dataclass(frozen=True)
class ToolContext:
    """Injected into a tool that declares a parameter of this type (not part of its schema).

    ``call_id`` is the model's ``tool_use`` id: it stays the same if the call is run again
    after a crash, so use it as an idempotency key for side effects.
    """

    call_id: str
    session_id: str
    run_id: str
    agent_name: str
    logger: logging.LoggerAdapter[logging.Logger] = field(
        default_factory=lambda: logging.LoggerAdapter(logging.getLogger("anabranch.tool"), {})
    )
    pins: list[Pin] = field(default_factory=list, repr=False, compare=False)
    """What this call pinned so far (see ``pin``)."""

    def pin(self, text: str, *, label: str | None = None) -> None:
        """Keep ``text`` in the agent's view: after each compaction of its context it is
        re-attached (within caps: the 5 latest pins, 5,000 tokens each, 25,000 in all,
        less in a small window; a pin over them is named with its recall id instead).

        Pins count once the call returns without error; they are committed with its
        result, so a resumed session restores them. Works from sync and async tools.
        """
        if not isinstance(text, str) or not text.strip():
            raise ValueError("pin needs the text to keep, as a non-empty string")
        if label is not None and not isinstance(label, str):
            raise ValueError(f"pin label must be a string, not {label!r}")
        name = (label or text).strip().splitlines()[0][:PIN_LABEL_CHARS]
        self.pins.append(Pin(text=text, label=name))


@dataclass(frozen=True, eq=False)
class Tool:
    """A tool definition: name, description, JSON schema and the function behind it."""

    name: str
    description: str
    function: Callable[..., Any] = field(repr=False)
    input_schema: dict[str, Any] = field(repr=False)
    args_model: type[BaseModel] = field(repr=False)
    context_param: str | None = None
    timeout: float | None = None
    """Seconds; ``None`` uses the agent's ``tool_timeout``."""
    on_interrupt: OnInterrupt = "retry"
    """After a crash mid-call: run again with the same call id, or report it to the model."""
    needs_approval: NeedsApproval = False
    """Whether a call waits for ``Runtime.approve`` before it runs (see ``NeedsApproval``)."""
    clearable: bool = True
    """Whether an old result may be cleared (replaced by a stub naming its recall handle)
    when the context fills up. ``False`` for small, dense results the agent keeps using."""
    pin: bool = False
    """Pin every successful result: re-attached after each compaction (never cleared)."""

    @cached_property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.function)

    def validate_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Validated keyword arguments; raises ``pydantic.ValidationError``.

        Arguments that are already exactly what a plain schema asks for (each a ``str``,
        ``int``, ``float`` or ``bool``, possibly ``None``, with no constraints) are taken as
        they are: pydantic would return them unchanged. Anything else, a bad argument
        included, goes through ``args_model``, so the errors are pydantic's.
        """
        plain = self._plain_fields
        if plain is not None and type(arguments) is dict and len(arguments) <= len(plain):
            kwargs = _take_plain(plain, arguments)
            if kwargs is not None:
                return kwargs
        parsed = self.args_model.__pydantic_validator__.validate_python(arguments)
        return dict(parsed.__dict__)  # the fields, in order (extras and privates live apart)

    @cached_property
    def _plain_fields(self) -> tuple[_PlainField, ...] | None:
        """The fields, when every one is a plain scalar that validation returns unchanged."""
        return _plain_fields(self.args_model)


_PlainField = tuple[str, tuple[type, ...], bool, Any]
"""A field's name, the exact types taken unchanged, whether it is required, its default
(no sentinel in it: a deep copy of the tool copies the cached fields too)."""
_MISSING: Any = object()
_SCALARS = (str, int, float, bool)
_PLAIN_CONFIG = {"extra", "arbitrary_types_allowed"}
"""Config keys that change nothing for a plain scalar (``_build_tool`` sets both)."""


def _plain_fields(model: type[BaseModel]) -> tuple[_PlainField, ...] | None:
    """``model``'s fields as ``_PlainField``s, or None if validating it may change a value
    of the exact type (a constraint, a validator, an alias, a default factory, a config)."""
    config = model.model_config
    if config.get("extra") != "forbid" or set(config) - _PLAIN_CONFIG:
        return None
    decorators = model.__pydantic_decorators__  # validators, serializers, computed fields
    if model.__pydantic_post_init__ or any(
        getattr(decorators, kind.name) for kind in dataclasses.fields(decorators)
    ):
        return None
    fields: list[_PlainField] = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        options = typing.get_args(annotation)
        if annotation in _SCALARS:
            exact: tuple[type, ...] = (typing.cast(type, annotation),)
        elif (
            typing.get_origin(annotation) in (typing.Union, types.UnionType)
            and len(options) == 2
            and type(None) in options
            and any(option in _SCALARS for option in options)
        ):
            exact = options  # ``str | None`` and the like
        else:
            return None
        if info.metadata or info.alias or info.validation_alias or info.default_factory:
            return None
        if info.validate_default:  # a default that validation may change
            return None
        required = info.is_required()
        if not required and info.default is not None and type(info.default) not in _SCALARS:
            return None
        fields.append((name, exact, required, None if required else info.default))
    return tuple(fields)


def _take_plain(
    fields: tuple[_PlainField, ...], arguments: dict[str, Any]
) -> dict[str, Any] | None:
    """``arguments`` as keyword arguments if each is of its field's exact type and none is
    unknown or missing; None otherwise (validation decides)."""
    kwargs: dict[str, Any] = {}
    given = 0
    for name, exact, required, default in fields:
        value = arguments.get(name, _MISSING)
        if value is _MISSING:
            if required:
                return None
            kwargs[name] = default
        elif type(value) in exact:
            kwargs[name] = value
            given += 1
        else:
            return None
    return kwargs if given == len(arguments) else None


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """The summary paragraph and Google-style ``Args:`` descriptions of a docstring."""
    doc = inspect.cleandoc(doc)
    if not doc:
        return "", {}
    sections = re.split(r"\n\s*(Args|Arguments|Parameters|Returns|Raises):\s*\n", doc)
    summary = sections[0].strip()
    params: dict[str, str] = {}
    for index in range(1, len(sections) - 1, 2):
        if sections[index] not in ("Args", "Arguments", "Parameters"):
            continue
        current: str | None = None
        for line in sections[index + 1].splitlines():
            match = re.match(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
            if match:
                current = match.group(1)
                params[current] = match.group(2).strip()
            elif current and line.strip():
                params[current] += " " + line.strip()
    return summary, params


def _strip_titles(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {
            key: _strip_titles(value)
            for key, value in schema.items()
            if not (key == "title" and isinstance(value, str))
        }
    if isinstance(schema, list):
        return [_strip_titles(item) for item in schema]
    return schema


def _is_tool_context(annotation: Any) -> bool:
    """``ToolContext``, ``ToolContext | None`` or ``Optional[ToolContext]``."""
    if annotation is ToolContext:
        return True
    return ToolContext in typing.get_args(annotation) and all(
        arg in (ToolContext, type(None)) for arg in typing.get_args(annotation)
    )


def _build_tool(
    function: Callable[..., Any],
    *,
    name: str | None,
    description: str | None,
    timeout: float | None,
    on_interrupt: OnInterrupt,
    needs_approval: NeedsApproval = False,
    clearable: bool = True,
    pin: bool = False,
) -> Tool:
    tool_name = name or function.__name__
    if not _NAME.match(tool_name):
        raise ToolDefinitionError(
            f"tool name {tool_name!r} must be 1-64 characters of letters, digits, '_' or '-'"
        )
    try:
        hints = typing.get_type_hints(function, include_extras=True)
    except Exception as exc:
        raise ToolDefinitionError(f"tool {tool_name!r}: cannot resolve type hints: {exc}") from exc
    summary, param_docs = _docstring_parts(function.__doc__ or "")
    fields: dict[str, Any] = {}
    context_param: str | None = None
    for param in inspect.signature(function).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(
                f"tool {tool_name!r}: *args/**kwargs cannot be described to a model; "
                f"declare each parameter"
            )
        if param.name not in hints:
            raise ToolDefinitionError(
                f"tool {tool_name!r}: parameter {param.name!r} needs a type annotation"
            )
        annotation = hints[param.name]
        if _is_tool_context(annotation):
            context_param = param.name
            continue
        default = ... if param.default is param.empty else param.default
        if param.name in param_docs:
            fields[param.name] = (
                annotation,
                pydantic.Field(default, description=param_docs[param.name]),
            )
        else:
            fields[param.name] = (annotation, default)
    try:
        args_model = pydantic.create_model(
            f"{tool_name}_arguments",
            __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
            **fields,
        )
        schema = _strip_titles(args_model.model_json_schema())
    except Exception as exc:
        raise ToolDefinitionError(
            f"tool {tool_name!r}: its parameters cannot be turned into a JSON schema: {exc}"
        ) from exc
    tool_description = description if description is not None else summary
    if not tool_description:
        raise ToolDefinitionError(
            f"tool {tool_name!r} needs a description: write a docstring or pass description="
        )
    return Tool(
        name=tool_name,
        description=tool_description,
        function=function,
        input_schema=schema,
        args_model=args_model,
        context_param=context_param,
        timeout=timeout,
        on_interrupt=on_interrupt,
        needs_approval=needs_approval,
        clearable=clearable,
        pin=pin,
    )


@overload
def tool(function: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    on_interrupt: OnInterrupt = "retry",
    needs_approval: NeedsApproval = False,
    clearable: bool = True,
    pin: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    on_interrupt: OnInterrupt = "retry",
    needs_approval: NeedsApproval = False,
    clearable: bool = True,
    pin: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a sync or async function into a ``Tool``.

    The JSON schema comes from the type hints (``Annotated``/``Field`` descriptions are
    honoured), the description from the docstring. A parameter typed ``ToolContext`` is
    injected at call time and left out of the schema.

    ``clearable`` (default ``True``): whether old results of this tool may be cleared to
    make room (each becomes a one-line stub with its recall handle; nothing is lost).
    Declare ``clearable=False`` for small, dense results the agent keeps referring to (a
    checksum, an id, a verdict): clearing leaves them in the context as they are.

    ``pin=True``: every successful result is pinned (as ``ToolContext.pin`` does), so it
    is re-attached after each compaction; a pinned tool's results are never cleared.

    Raises:
        ToolDefinitionError: the signature cannot be described to a model.
    """
    if on_interrupt not in ("retry", "report"):
        raise ToolDefinitionError(f"on_interrupt must be 'retry' or 'report', not {on_interrupt!r}")
    if not isinstance(needs_approval, bool) and not callable(needs_approval):
        raise ToolDefinitionError(
            f"needs_approval must be True/False or a function of the arguments, "
            f"not {needs_approval!r}"
        )
    if not isinstance(clearable, bool):
        raise ToolDefinitionError(f"clearable must be True or False, not {clearable!r}")
    if not isinstance(pin, bool):
        raise ToolDefinitionError(f"pin must be True or False, not {pin!r}")

    def decorate(fn: Callable[..., Any]) -> Tool:
        return _build_tool(
            fn,
            name=name,
            description=description,
            timeout=timeout,
            on_interrupt=on_interrupt,
            needs_approval=needs_approval,
            clearable=clearable,
            pin=pin,
        )

    if function is not None:
        return decorate(function)
    return decorate
