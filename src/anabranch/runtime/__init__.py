"""The runtime: composes agents, context, store and traces into running sessions.

Everything under it is private (``_`` modules); this facade is the public part.
"""

from anabranch.runtime._results import GraphResult as GraphResult
from anabranch.runtime._results import RunResult as RunResult
from anabranch.runtime._results import TaskResult as TaskResult
from anabranch.runtime._runtime import Runtime as Runtime
from anabranch.runtime._spawn import SpawnLimits as SpawnLimits

__all__ = ["GraphResult", "RunResult", "Runtime", "SpawnLimits", "TaskResult"]
