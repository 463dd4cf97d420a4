"""Test doubles users test their agents with: offline models and a local Messages API.

Names are imported on first use, so ``anabranch --help`` (which registers
``anabranch testing serve``) does not load the server and the test models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anabranch._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
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

__getattr__, __dir__ = _lazy_exports(
    __name__,
    {
        "ManualClock": "anabranch.testing._cache",
        "Fault": "anabranch.testing._faults",
        "FaultKind": "anabranch.testing._faults",
        "FaultPlan": "anabranch.testing._faults",
        "FunctionModel": "anabranch.testing._models",
        "TestModel": "anabranch.testing._models",
        "arguments_for_schema": "anabranch.testing._models",
        "ScriptedPolicy": "anabranch.testing._policies",
        "ScriptExhaustedError": "anabranch.testing._policies",
        "RequestRecord": "anabranch.testing._records",
        "MessagesServer": "anabranch.testing._server",
        "redacted_block": "anabranch.testing._signing",
        "thinking_block": "anabranch.testing._signing",
    },
)
