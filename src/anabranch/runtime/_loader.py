"""Load an ``Agent`` (or other definition) from ``path/to/file.py:name`` or ``package.module:name``.

Loading a reference *executes* its file. ``load_object`` is for references the user named
(on the command line, in code). A reference read back from a database goes through
``load_recorded``, which runs the file only if it is byte for byte the one recorded when the
session started (its SHA-256), so a database handed over by someone else cannot make
``resume`` run a file of their choosing.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from anabranch.errors import UserError

if TYPE_CHECKING:  # kept out of import time: `anabranch worker --help` loads this module
    from anabranch.agents import Agent, Graph
    from anabranch.store import SessionRecord

__all__ = [
    "DIGEST_KEY",
    "Reference",
    "load_module",
    "load_object",
    "load_recorded",
    "parse_reference",
    "recorded_digest",
    "resolve_recorded",
    "source_digest",
    "split_reference",
]


@dataclass(frozen=True)
class Reference:
    """Where a definition lives: a file (``path``) or an importable module (``module``)."""

    name: str
    path: Path | None = None
    module: str | None = None

    def __str__(self) -> str:
        return f"{self.path if self.path is not None else self.module}:{self.name}"


def parse_reference(reference: str) -> Reference:
    """``file.py:obj`` (a path) or ``package.module:obj`` (imported from ``sys.path``)."""
    head, sep, name = reference.rpartition(":")
    if not sep or not head or not name:
        raise UserError(
            "expected FILE:OBJECT or MODULE:OBJECT (e.g. examples/research.py:supervisor), "
            f"got {reference!r}"
        )
    if not name.isidentifier():
        raise UserError(f"{name!r} is not a Python name (in {reference!r})")
    path = Path(head).expanduser()
    is_module = (
        not head.endswith(".py")
        and "/" not in head
        and all(part.isidentifier() for part in head.split("."))
        and not path.exists()
    )
    if is_module:
        return Reference(name=name, module=head)
    return Reference(name=name, path=path.resolve())


def _module_file(module: str) -> Path | None:
    _cwd_on_path()
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.has_location:
        return None
    return Path(spec.origin)


def source_digest(reference: str) -> str | None:
    """SHA-256 of the file behind ``reference`` (None if there is no such file)."""
    ref = parse_reference(reference)
    path = ref.path if ref.path is not None else _module_file(ref.module or "")
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path is not None else None
    except OSError:
        return None


def load_module(path: Path) -> Any:
    """Import the Python file at ``path`` once per process and return the module (this runs
    its code).

    Raises:
        UserError: missing file or import failure.
    """
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise UserError(f"no Python file at {path}")
    module_name = "anabranch_user_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    module = sys.modules.get(module_name)
    if module is not None:
        return module
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


def _cwd_on_path() -> None:
    """Like ``python -m``: a module in the working directory is found without installing."""
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


def _import_module(name: str) -> Any:
    _cwd_on_path()
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise UserError(f"no Python file or module named {name!r}") from None
        raise UserError(f"importing {name} failed: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        raise UserError(f"importing {name} failed: {type(exc).__name__}: {exc}") from exc


def load_object(reference: str) -> Any:
    """Import the file (or module) and return the named object. This runs its code.

    Raises:
        UserError: missing file, import failure, or no such name in it.
    """
    ref = parse_reference(reference)
    if ref.path is not None:
        module = load_module(ref.path)
    else:
        module = _import_module(ref.module or "")
    try:
        return getattr(module, ref.name)
    except AttributeError:
        where = ref.path if ref.path is not None else ref.module
        raise UserError(f"{where} has no object named {ref.name!r}") from None


def load_recorded(reference: str, digest: str | None, what: str) -> Any:
    """``load_object`` for a reference read from a database: only if its file is unchanged.

    Raises:
        UserError: no digest was recorded, or the file is missing or differs from the one
            recorded; the message names the file and says how to choose a definition.
    """
    advice = f"name the definition to run yourself (anabranch resume ID FILE:OBJ) for {what}"
    if digest is None:
        raise UserError(
            f"refusing to run {reference}: the database recorded no digest of it; {advice}"
        )
    current = source_digest(reference)
    if current is None:
        raise UserError(f"refusing to run {reference}: the file is missing; {advice}")
    if current != digest:
        raise UserError(
            f"refusing to run {reference}: it changed since the session started; {advice}"
        )
    return load_object(reference)


DIGEST_KEY = "source_sha256"
"""The key of the source's digest in a session's recorded definition outline."""


def recorded_digest(definition: str | None) -> str | None:
    """The digest recorded in a session's ``definition`` outline (JSON), if any."""
    from anabranch.runtime._history import outline_from

    value = outline_from(definition).get(DIGEST_KEY)
    return value if isinstance(value, str) else None


def split_reference(reference: str) -> tuple[Path, str]:
    """``file.py:obj`` -> (absolute path, object name), for file references only."""
    ref = parse_reference(reference)
    if ref.path is None:
        raise UserError(f"{reference!r} names a module, not a file")
    return ref.path, ref.name


Definition = TypeVar("Definition", "Agent", "Graph")


def resolve_recorded(
    session: SessionRecord,
    kind: type[Definition],
    registered: Mapping[str, Definition],
    register: Callable[[Definition], None],
    *,
    hint: str,
) -> Definition:
    """The agent or graph a session runs: registered under its entry name, else the one its
    recorded source file defines (only if that file is unchanged since the session started;
    it is then registered). ``hint`` ends the error when neither has it."""
    found = registered.get(session.entry)
    if found is not None:
        return found
    if session.source:
        loaded = load_recorded(
            session.source, recorded_digest(session.definition), f"session {session.id}"
        )
        if isinstance(loaded, kind) and loaded.name == session.entry:
            register(loaded)
            return loaded
    noun = kind.__name__.lower()
    raise UserError(
        f"cannot find {noun} {session.entry!r} to resume session {session.id}: {hint}"
    )
