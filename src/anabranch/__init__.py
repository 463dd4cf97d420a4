"""anabranch: an async multi-agent runtime in which every agent has its own isolated,
self-compacting, persisted context.

Names are imported on first use: ``import anabranch`` alone costs almost nothing, so the
command line starts fast.
"""

from typing import TYPE_CHECKING

from anabranch._lazy import lazy_exports as _lazy_exports
from anabranch._version import VERSION as __version__  # noqa: F401

if TYPE_CHECKING:
    from anabranch.agents import Agent as Agent
    from anabranch.agents import Budget as Budget
    from anabranch.agents import ContextPolicy as ContextPolicy
    from anabranch.agents import Graph as Graph
    from anabranch.agents import InstructionLevel as InstructionLevel
    from anabranch.agents import Memory as Memory
    from anabranch.agents import Task as Task
    from anabranch.agents import Tool as Tool
    from anabranch.agents import ToolContext as ToolContext
    from anabranch.agents import standard_instruction_files as standard_instruction_files
    from anabranch.agents import tool as tool
    from anabranch.context._compaction import CompactionEvent as CompactionEvent
    from anabranch.errors import AnabranchError as AnabranchError
    from anabranch.errors import ApprovalPendingError as ApprovalPendingError
    from anabranch.errors import BudgetExceeded as BudgetExceeded
    from anabranch.errors import CompactionFailedError as CompactionFailedError
    from anabranch.errors import DatabaseError as DatabaseError
    from anabranch.errors import LeaseLostError as LeaseLostError
    from anabranch.errors import MaxTurnsExceeded as MaxTurnsExceeded
    from anabranch.errors import ModelAPIError as ModelAPIError
    from anabranch.errors import ModelConnectionError as ModelConnectionError
    from anabranch.errors import ModelError as ModelError
    from anabranch.errors import OutputValidationError as OutputValidationError
    from anabranch.errors import OverloadedError as OverloadedError
    from anabranch.errors import PromptTooLongError as PromptTooLongError
    from anabranch.errors import RateLimitedError as RateLimitedError
    from anabranch.errors import RunError as RunError
    from anabranch.errors import RunFailedError as RunFailedError
    from anabranch.errors import ServerError as ServerError
    from anabranch.errors import SessionBusyError as SessionBusyError
    from anabranch.errors import SessionError as SessionError
    from anabranch.errors import SessionNotFoundError as SessionNotFoundError
    from anabranch.errors import StoreError as StoreError
    from anabranch.errors import ToolDefinitionError as ToolDefinitionError
    from anabranch.errors import UserError as UserError
    from anabranch.messages import Block as Block
    from anabranch.messages import Document as Document
    from anabranch.messages import Image as Image
    from anabranch.messages import Message as Message
    from anabranch.messages import ModelRequest as ModelRequest
    from anabranch.messages import ModelResponse as ModelResponse
    from anabranch.messages import ModelSettings as ModelSettings
    from anabranch.messages import RedactedThinkingBlock as RedactedThinkingBlock
    from anabranch.messages import SystemBlock as SystemBlock
    from anabranch.messages import TextBlock as TextBlock
    from anabranch.messages import ThinkingBlock as ThinkingBlock
    from anabranch.messages import ToolDefinition as ToolDefinition
    from anabranch.messages import ToolResultBlock as ToolResultBlock
    from anabranch.messages import ToolUseBlock as ToolUseBlock
    from anabranch.messages import Usage as Usage
    from anabranch.models import AnthropicModel as AnthropicModel
    from anabranch.models import Model as Model
    from anabranch.models import RetryPolicy as RetryPolicy
    from anabranch.runtime import GraphResult as GraphResult
    from anabranch.runtime import IdleCompactor as IdleCompactor
    from anabranch.runtime import RunResult as RunResult
    from anabranch.runtime import Runtime as Runtime
    from anabranch.runtime import SpawnLimits as SpawnLimits
    from anabranch.runtime import TaskResult as TaskResult

__all__ = [
    "Agent",
    "AnabranchError",
    "ApprovalPendingError",
    "AnthropicModel",
    "Block",
    "Budget",
    "BudgetExceeded",
    "CompactionEvent",
    "CompactionFailedError",
    "ContextPolicy",
    "DatabaseError",
    "Document",
    "Graph",
    "GraphResult",
    "IdleCompactor",
    "Image",
    "InstructionLevel",
    "LeaseLostError",
    "MaxTurnsExceeded",
    "Memory",
    "Message",
    "Model",
    "ModelAPIError",
    "ModelConnectionError",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "ModelSettings",
    "OutputValidationError",
    "OverloadedError",
    "PromptTooLongError",
    "RateLimitedError",
    "RedactedThinkingBlock",
    "RetryPolicy",
    "RunError",
    "RunFailedError",
    "RunResult",
    "Runtime",
    "ServerError",
    "SessionBusyError",
    "SessionError",
    "SessionNotFoundError",
    "SpawnLimits",
    "StoreError",
    "SystemBlock",
    "Task",
    "TaskResult",
    "TextBlock",
    "ThinkingBlock",
    "Tool",
    "ToolContext",
    "ToolDefinition",
    "ToolDefinitionError",
    "ToolResultBlock",
    "ToolUseBlock",
    "Usage",
    "UserError",
    "standard_instruction_files",
    "tool",
]

_SOURCES = {
    "Agent": "anabranch.agents",
    "AnabranchError": "anabranch.errors",
    "AnthropicModel": "anabranch.models",
    "ApprovalPendingError": "anabranch.errors",
    "Block": "anabranch.messages",
    "Budget": "anabranch.agents",
    "BudgetExceeded": "anabranch.errors",
    "CompactionEvent": "anabranch.context._compaction",
    "CompactionFailedError": "anabranch.errors",
    "ContextPolicy": "anabranch.agents",
    "DatabaseError": "anabranch.errors",
    "Document": "anabranch.messages",
    "Graph": "anabranch.agents",
    "GraphResult": "anabranch.runtime",
    "Image": "anabranch.messages",
    "InstructionLevel": "anabranch.agents",
    "LeaseLostError": "anabranch.errors",
    "MaxTurnsExceeded": "anabranch.errors",
    "Memory": "anabranch.agents",
    "Message": "anabranch.messages",
    "Model": "anabranch.models",
    "ModelAPIError": "anabranch.errors",
    "ModelConnectionError": "anabranch.errors",
    "ModelError": "anabranch.errors",
    "ModelRequest": "anabranch.messages",
    "ModelResponse": "anabranch.messages",
    "ModelSettings": "anabranch.messages",
    "OutputValidationError": "anabranch.errors",
    "OverloadedError": "anabranch.errors",
    "PromptTooLongError": "anabranch.errors",
    "RateLimitedError": "anabranch.errors",
    "RedactedThinkingBlock": "anabranch.messages",
    "RetryPolicy": "anabranch.models",
    "RunError": "anabranch.errors",
    "RunFailedError": "anabranch.errors",
    "RunResult": "anabranch.runtime",
    "IdleCompactor": "anabranch.runtime",
    "Runtime": "anabranch.runtime",
    "ServerError": "anabranch.errors",
    "SessionBusyError": "anabranch.errors",
    "SessionError": "anabranch.errors",
    "SessionNotFoundError": "anabranch.errors",
    "SpawnLimits": "anabranch.runtime",
    "StoreError": "anabranch.errors",
    "SystemBlock": "anabranch.messages",
    "Task": "anabranch.agents",
    "TaskResult": "anabranch.runtime",
    "TextBlock": "anabranch.messages",
    "ThinkingBlock": "anabranch.messages",
    "Tool": "anabranch.agents",
    "ToolContext": "anabranch.agents",
    "ToolDefinition": "anabranch.messages",
    "ToolDefinitionError": "anabranch.errors",
    "ToolResultBlock": "anabranch.messages",
    "ToolUseBlock": "anabranch.messages",
    "Usage": "anabranch.messages",
    "UserError": "anabranch.errors",
    "standard_instruction_files": "anabranch.agents",
    "tool": "anabranch.agents",
}

__getattr__, __dir__ = _lazy_exports(__name__, _SOURCES)
