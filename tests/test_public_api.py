"""The public facade: each public module's ``__all__`` is exactly what it exports."""

from __future__ import annotations

import importlib
import pkgutil
import types

import pytest

import anabranch


def _public_modules() -> list[str]:
    """Every module of the package with no ``_`` part in its dotted name."""
    names = ["anabranch"]
    for info in pkgutil.walk_packages(anabranch.__path__, "anabranch."):
        parts = info.name.split(".")[1:]
        if not any(part.startswith("_") for part in parts):
            names.append(info.name)
    return sorted(names)


PUBLIC_MODULES = _public_modules()


def test_the_public_modules_are_the_documented_ones() -> None:
    assert {
        "anabranch",
        "anabranch.agents",
        "anabranch.errors",
        "anabranch.messages",
        "anabranch.models",
        "anabranch.runtime",
        "anabranch.store",
        "anabranch.store.sqlite",
        "anabranch.testing",
        "anabranch.traces",
        "anabranch.traces.configure",
    } <= set(PUBLIC_MODULES)


def _exported(module: types.ModuleType) -> set[str]:
    """The public names a module offers: what it defines, and (for a package facade) what
    it re-exports from anabranch's modules; names it only imports to use do not count."""
    facade = hasattr(module, "__path__") or module.__name__ == "anabranch"
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        home = getattr(value, "__module__", None)
        if not isinstance(home, str):
            continue
        if home == module.__name__ or (facade and home.startswith("anabranch.")):
            names.add(name)
    return names


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_all_is_exactly_what_the_module_exports(module_name: str) -> None:
    module = importlib.import_module(module_name)
    declared = getattr(module, "__all__", None)
    assert declared is not None, f"{module_name} has no __all__"
    assert len(set(declared)) == len(declared), f"{module_name}.__all__ repeats a name"
    missing = sorted(name for name in declared if not hasattr(module, name))
    assert not missing, f"{module_name}.__all__ names what it does not have: {missing}"
    undeclared = sorted(_exported(module) - set(declared))
    assert not undeclared, f"{module_name} exports names missing from __all__: {undeclared}"


def test_the_drift_check_catches_both_directions() -> None:
    fake = types.ModuleType("anabranch.fake")

    class Exported:
        pass

    Exported.__module__ = "anabranch.fake"
    fake.Exported = Exported  # type: ignore[attr-defined]
    assert _exported(fake) == {"Exported"}  # not in an __all__: drift
    fake.__all__ = ["Exported", "Gone"]  # type: ignore[attr-defined]
    assert not hasattr(fake, "Gone")  # in __all__ but absent: drift


def test_the_documented_imports_work() -> None:
    from anabranch import (  # noqa: F401
        Agent,
        ContextPolicy,
        Graph,
        Runtime,
        Task,
        ToolContext,
        tool,
    )
    from anabranch.testing import FunctionModel, MessagesServer, TestModel  # noqa: F401
