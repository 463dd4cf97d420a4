"""The runtime: composes agents, context, store and traces into running sessions.

Everything under it is private (``_`` modules); this facade is the public part, imported on
first use (so ``anabranch.runtime._report`` does not pull in the whole engine).
"""

from typing import TYPE_CHECKING

from anabranch._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from anabranch.runtime._idle import IdleCompaction as IdleCompaction
    from anabranch.runtime._idle import IdleCompactor as IdleCompactor
    from anabranch.runtime._idle import IdleSweep as IdleSweep
    from anabranch.runtime._results import GraphResult as GraphResult
    from anabranch.runtime._results import RunResult as RunResult
    from anabranch.runtime._results import TaskResult as TaskResult
    from anabranch.runtime._runtime import Runtime as Runtime
    from anabranch.runtime._spawn import SpawnLimits as SpawnLimits

__all__ = [
    "GraphResult",
    "IdleCompaction",
    "IdleCompactor",
    "IdleSweep",
    "RunResult",
    "Runtime",
    "SpawnLimits",
    "TaskResult",
]

__getattr__, __dir__ = _lazy_exports(
    __name__,
    {
        "GraphResult": "anabranch.runtime._results",
        "IdleCompaction": "anabranch.runtime._idle",
        "IdleCompactor": "anabranch.runtime._idle",
        "IdleSweep": "anabranch.runtime._idle",
        "RunResult": "anabranch.runtime._results",
        "TaskResult": "anabranch.runtime._results",
        "Runtime": "anabranch.runtime._runtime",
        "SpawnLimits": "anabranch.runtime._spawn",
    },
)
