"""Pure agent definitions: no I/O here."""

from anabranch.agents.agent import RESERVED_TOOL_NAMES as RESERVED_TOOL_NAMES
from anabranch.agents.agent import Agent as Agent
from anabranch.agents.graph import Graph as Graph
from anabranch.agents.graph import Task as Task
from anabranch.agents.policy import CompactionStrategy as CompactionStrategy
from anabranch.agents.policy import ContextPolicy as ContextPolicy
from anabranch.agents.tools import OnInterrupt as OnInterrupt
from anabranch.agents.tools import Tool as Tool
from anabranch.agents.tools import ToolContext as ToolContext
from anabranch.agents.tools import tool as tool

__all__ = [
    "RESERVED_TOOL_NAMES",
    "Agent",
    "CompactionStrategy",
    "ContextPolicy",
    "Graph",
    "OnInterrupt",
    "Task",
    "Tool",
    "ToolContext",
    "tool",
]
