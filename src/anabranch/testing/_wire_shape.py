"""The Messages API's request shape errors, in its wording (``<path>: <message>``, with
pydantic-style messages), and the small checks every parser of the local server uses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

__all__ = ["APIFailure", "fail", "as_dict", "as_list", "as_str", "required", "no_extra"]


class APIFailure(Exception):
    """An error answer: HTTP status, the API's error type and message, extra headers."""

    def __init__(
        self,
        status: int,
        error_type: str,
        message: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.headers = dict(headers or {})

    @classmethod
    def invalid(cls, message: str) -> APIFailure:
        """A 400 ``invalid_request_error``."""
        return cls(400, "invalid_request_error", message)


def fail(path: str, message: str) -> NoReturn:
    raise APIFailure.invalid(f"{path}: {message}")


def as_dict(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        fail(path, "Input should be a valid dictionary")
    return value


def as_list(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        fail(path, "Input should be a valid list")
    return value


def as_str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        fail(path, "Input should be a valid string")
    return value


def required(obj: dict[str, Any], key: str, path: str) -> Any:
    if key not in obj:
        fail(f"{path}.{key}" if path else key, "Field required")
    return obj[key]


def no_extra(obj: dict[str, Any], allowed: frozenset[str], path: str) -> None:
    for key in obj:
        if key not in allowed:
            fail(f"{path}.{key}" if path else key, "Extra inputs are not permitted")
