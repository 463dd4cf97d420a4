"""anabranch: an async multi-agent runtime in which every agent has its own isolated,
self-compacting, persisted context."""

from anabranch.agents import Agent as Agent
from anabranch.agents import ContextPolicy as ContextPolicy
from anabranch.agents import Graph as Graph
from anabranch.agents import Task as Task
from anabranch.agents import Tool as Tool
from anabranch.agents import ToolContext as ToolContext
from anabranch.agents import tool as tool
from anabranch.context.compaction import CompactionEvent as CompactionEvent
from anabranch.context.messages import Message as Message
from anabranch.context.messages import ModelRequest as ModelRequest
from anabranch.context.messages import ModelResponse as ModelResponse
from anabranch.context.messages import Usage as Usage
from anabranch.runtime.anthropic_model import AnthropicModel as AnthropicModel
from anabranch.runtime.model import Model as Model
from anabranch.runtime.results import GraphResult as GraphResult
from anabranch.runtime.results import RunResult as RunResult
from anabranch.runtime.results import TaskResult as TaskResult
from anabranch.runtime.retry import RetryPolicy as RetryPolicy
from anabranch.runtime.runtime import Runtime as Runtime
from anabranch.runtime.spawn import SpawnLimits as SpawnLimits

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AnthropicModel",
    "CompactionEvent",
    "ContextPolicy",
    "Graph",
    "GraphResult",
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "RetryPolicy",
    "RunResult",
    "Runtime",
    "SpawnLimits",
    "Task",
    "TaskResult",
    "Tool",
    "ToolContext",
    "Usage",
    "tool",
]
