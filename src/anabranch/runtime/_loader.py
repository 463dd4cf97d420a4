"""Load an ``Agent`` (or other definition) from ``path/to/file.py:name``."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from anabranch.errors import UserError

__all__ = ["load_module", "load_object", "split_reference"]


def split_reference(reference: str) -> tuple[Path, str]:
    """``file.py:obj`` -> (absolute path, object name)."""
    path_text, sep, name = reference.rpartition(":")
    if not sep or not path_text or not name:
        raise UserError(
            f"expected FILE:OBJECT (e.g. examples/research.py:supervisor), got {reference!r}"
        )
    if not name.isidentifier():
        raise UserError(f"{name!r} is not a Python name (in {reference!r})")
    return Path(path_text).expanduser().resolve(), name


def load_object(reference: str) -> Any:
    """Import the file and return the named object.

    Raises:
        UserError: missing file, import failure, or no such name in it.
    """
    path, name = split_reference(reference)
    module = load_module(path)
    try:
        return getattr(module, name)
    except AttributeError:
        raise UserError(f"{path} has no object named {name!r}") from None


def load_module(path: Path) -> Any:
    """Import the Python file at ``path`` once per process and return the module.

    Raises:
        UserError: missing file or import failure.
    """
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise UserError(f"no Python file at {path}")
    module_name = "anabranch_user_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise UserError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        sys.path.insert(0, str(path.parent))
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[module_name]
            raise UserError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            if sys.path and sys.path[0] == str(path.parent):
                sys.path.pop(0)
    return module
