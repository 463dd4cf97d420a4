"""What each memory type is for and what never to save: the words every prompt that
writes memories shares (the agent's static prompt, the extraction before a compaction,
the model-written consolidation)."""

from __future__ import annotations

__all__ = ["NEVER_SAVE", "TYPE_GUIDANCE"]

TYPE_GUIDANCE = """\
- user: who the user is — role, expertise, preferences, how they like answers.
- feedback: corrections and confirmations of how to work, with the reason.
- project: goals, decisions, constraints and deadlines that the code does not show.
- reference: where to find things (documents, dashboards, tickets, people)."""

NEVER_SAVE = """\
Never save: what can be read from the code or the repository, what the instruction or \
bootstrap files already say, secrets or credentials of any kind, or details of this one \
task."""
