"""Pure context logic: messages, token accounting, prompt assembly, compaction."""

__all__: list[str] = []
