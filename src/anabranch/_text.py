"""Valid Unicode and deterministic JSON: what every text field and hash in the message
model relies on (no I/O, no pydantic models)."""

from __future__ import annotations

import json
import json.encoder
import re
from typing import Annotated, Any

from pydantic import AfterValidator, ValidationInfo

__all__ = [
    "ValidJSONObject",
    "ValidText",
    "canonical_json",
    "json_string",
    "valid_json",
    "valid_text",
]

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """``text`` as valid Unicode: each lone surrogate becomes U+FFFD.

    Python strings may hold lone surrogates (``os.fsdecode`` and ``os.listdir`` give them for
    file names that are not UTF-8, ``surrogateescape`` decoding gives them for any bytes);
    they cannot be encoded as UTF-8, so neither SQLite nor the API could take them. NUL and
    every other code point are valid and kept.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub("\ufffd", text)
    return text


def valid_json(value: Any) -> Any:
    """A JSON-like value with every string in it (keys too) passed through ``valid_text``."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        return {valid_text(str(k)): valid_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [valid_json(v) for v in value]
    return value


def _python_text(text: str, info: ValidationInfo) -> str:
    # JSON input cannot carry a lone surrogate (pydantic's parser refuses one): only Python
    # objects need the check, so loading stored messages pays nothing for it.
    return text if info.mode == "json" else valid_text(text)


def _python_json(value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
    return value if info.mode == "json" else valid_json(value)


ValidText = Annotated[str, AfterValidator(_python_text)]
"""A ``str`` field that never holds a lone surrogate (see ``valid_text``)."""

ValidJSONObject = Annotated[dict[str, Any], AfterValidator(_python_json)]


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace. Used for anything cached or hashed."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


json_string = json.encoder.encode_basestring
"""``canonical_json`` of one string (the very function ``json.dumps`` uses for it with
``ensure_ascii=False``): for encoders that write a fixed-shape record out directly."""
