"""Pure context logic: messages, token accounting, prompt assembly, compaction."""
