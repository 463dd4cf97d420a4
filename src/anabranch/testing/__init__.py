"""Test doubles users test their agents with: offline models and a local Messages API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from anabranch.testing._cache import ManualClock as ManualClock
from anabranch.testing._faults import Fault as Fault
from anabranch.testing._faults import FaultKind as FaultKind
from anabranch.testing._faults import FaultPlan as FaultPlan
from anabranch.testing.models import FunctionModel as FunctionModel
from anabranch.testing.models import TestModel as TestModel
from anabranch.testing.models import arguments_for_schema as arguments_for_schema
from anabranch.testing.policies import ScriptedPolicy as ScriptedPolicy
from anabranch.testing.policies import ScriptExhaustedError as ScriptExhaustedError
from anabranch.testing.records import RequestRecord as RequestRecord

if TYPE_CHECKING:
    from anabranch.testing.server import MessagesServer as MessagesServer

__all__ = [
    "Fault",
    "FaultKind",
    "FaultPlan",
    "FunctionModel",
    "ManualClock",
    "MessagesServer",
    "RequestRecord",
    "ScriptExhaustedError",
    "ScriptedPolicy",
    "TestModel",
    "arguments_for_schema",
]


def __getattr__(name: str) -> Any:
    # Imported on first use so `python -m anabranch.testing.server` runs the module cleanly.
    if name == "MessagesServer":
        from anabranch.testing.server import MessagesServer

        return MessagesServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
