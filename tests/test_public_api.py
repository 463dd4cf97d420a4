"""The public facade: every name in ``__all__`` exists and the documented imports work."""

from __future__ import annotations

import importlib

import pytest

PUBLIC_MODULES = [
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
]


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_all_names_exist(module_name: str) -> None:
    module = importlib.import_module(module_name)
    exported = getattr(module, "__all__", None)
    assert exported, f"{module_name} has no __all__"
    missing = [name for name in exported if not hasattr(module, name)]
    assert not missing, f"{module_name}.__all__ names missing objects: {missing}"
    assert len(set(exported)) == len(exported)


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
