"""Test doubles users test their agents with: offline models and a local Messages API."""

from __future__ import annotations

from anabranch.testing._cache import ManualClock as ManualClock
from anabranch.testing._faults import Fault as Fault
from anabranch.testing._faults import FaultKind as FaultKind
from anabranch.testing._faults import FaultPlan as FaultPlan
from anabranch.testing._models import FunctionModel as FunctionModel
from anabranch.testing._models import TestModel as TestModel
from anabranch.testing._models import arguments_for_schema as arguments_for_schema
from anabranch.testing._policies import ScriptedPolicy as ScriptedPolicy
from anabranch.testing._policies import ScriptExhaustedError as ScriptExhaustedError
from anabranch.testing._records import RequestRecord as RequestRecord
from anabranch.testing._server import MessagesServer as MessagesServer
from anabranch.testing._signing import redacted_block as redacted_block
from anabranch.testing._signing import thinking_block as thinking_block

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
    "redacted_block",
    "thinking_block",
]
