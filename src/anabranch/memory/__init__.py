"""Long-term memory across sessions: typed memory files, the ``MEMORY.md`` index,
relevance selection and consolidation. Configure it with ``anabranch.Memory``."""

from anabranch.memory._consolidate import ConsolidationReport as ConsolidationReport
from anabranch.memory._consolidate import consolidate as consolidate
from anabranch.memory._consolidate import consolidation_due as consolidation_due
from anabranch.memory._consolidate_model import ModelRequester as ModelRequester
from anabranch.memory._consolidate_model import consolidate_with_model as consolidate_with_model
from anabranch.memory._files import MemoryFile as MemoryFile
from anabranch.memory._files import MemoryFolder as MemoryFolder
from anabranch.memory._files import MemoryWriteError as MemoryWriteError
from anabranch.memory._files import Provenance as Provenance

__all__ = [
    "ConsolidationReport",
    "MemoryFile",
    "MemoryFolder",
    "MemoryWriteError",
    "ModelRequester",
    "Provenance",
    "consolidate",
    "consolidate_with_model",
    "consolidation_due",
]
