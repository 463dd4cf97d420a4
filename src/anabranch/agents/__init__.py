"""Pure agent definitions: no I/O here."""

from anabranch.agents._agent import RESERVED_TOOL_NAMES as RESERVED_TOOL_NAMES
from anabranch.agents._agent import Agent as Agent
from anabranch.agents._budget import Budget as Budget
from anabranch.agents._budget import BudgetPeriod as BudgetPeriod
from anabranch.agents._budget import OnLimit as OnLimit
from anabranch.agents._graph import Graph as Graph
from anabranch.agents._graph import Task as Task
from anabranch.agents._memory import MEMORY_TYPES as MEMORY_TYPES
from anabranch.agents._memory import InstructionLevel as InstructionLevel
from anabranch.agents._memory import Memory as Memory
from anabranch.agents._memory import MemoryType as MemoryType
from anabranch.agents._memory import standard_instruction_files as standard_instruction_files
from anabranch.agents._policy import CompactionStrategy as CompactionStrategy
from anabranch.agents._policy import ContextPolicy as ContextPolicy
from anabranch.agents._tools import OnInterrupt as OnInterrupt
from anabranch.agents._tools import Tool as Tool
from anabranch.agents._tools import ToolContext as ToolContext
from anabranch.agents._tools import tool as tool

__all__ = [
    "MEMORY_TYPES",
    "RESERVED_TOOL_NAMES",
    "Agent",
    "Budget",
    "BudgetPeriod",
    "CompactionStrategy",
    "ContextPolicy",
    "Graph",
    "InstructionLevel",
    "Memory",
    "MemoryType",
    "OnInterrupt",
    "OnLimit",
    "Task",
    "Tool",
    "ToolContext",
    "standard_instruction_files",
    "tool",
]
