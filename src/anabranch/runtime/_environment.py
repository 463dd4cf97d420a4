"""``Environment``: what every run of one session shares (store, model, policies, hooks)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from anabranch.models._base import Model
from anabranch.models._retry import RetryPolicy
from anabranch.runtime._builtins import BuiltinTool
from anabranch.runtime._events import EventBus
from anabranch.runtime._pipeline import ContextPipeline
from anabranch.store import Store
from anabranch.traces import Tracing

__all__ = ["Environment"]


@dataclass
class Environment:
    """What every run of one session shares."""

    store: Store
    model: Model
    session_id: str
    retry: RetryPolicy
    tracing: Tracing
    pipeline: ContextPipeline
    """Reads each run through a ``ContextView``; its changes are committed by the loop."""
    builtins: tuple[BuiltinTool, ...] = ()
    extras: dict[str, Any] = field(default_factory=dict)
    """Room for cooperating features (e.g. a concurrency limiter for children)."""
    events: EventBus = field(default_factory=EventBus)
