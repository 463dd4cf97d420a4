"""``new_id``: the ids of runs and sessions, in the order this process made them.

An id is its prefix and 16 hex digits (64 bits): a random start drawn once per process,
plus, for the n-th id, ``n * 2**16`` and 16 random bits. So the ids one process makes
sort in the order it made them, no two of them are equal, and another process's ids
(another random start) fall elsewhere in the 64-bit space.

Why ordered: the store's busiest indexes lead with the run id (``messages(run_id, seq)``,
``tool_events(run_id, call_id)``, ``calls(run_id, turn)``). With random ids the runs
written in one transaction sit all over those b-trees, and each of them dirties a leaf
page of its own that the commit writes out whole: in the 1,000-run benchmark three
quarters of the pages a commit wrote were such leaves (59 pages a commit). Runs made
at about the same time and driven at about the same pace share leaves when their ids are
adjacent: 28 pages a commit, and the commit's CPU about a third less (docs/benchmarks.md,
round 8 "writer").
"""

from __future__ import annotations

import itertools
import os
import secrets

__all__ = ["new_id"]

_STEP_BITS = 16
_START = 0
"""This process's first id (below 2**62: over 2**46 ids fit in 64 bits after it)."""
_COUNT = itertools.count(1)
"""Ids made so far (``next`` on it is atomic under the GIL: safe from any thread)."""


def _restart() -> None:
    """A new random start (at import, and in a forked child: it must not repeat its
    parent's ids)."""
    global _START, _COUNT
    _START, _COUNT = secrets.randbits(62), itertools.count(1)


_restart()
os.register_at_fork(after_in_child=_restart)


def new_id(prefix: str) -> str:
    """A unique id, ``f"{prefix}_"`` and 16 lowercase hex digits, greater than the ones this
    process made before it (URL- and shell-safe: never starts with '-')."""
    value = _START + (next(_COUNT) << _STEP_BITS) + secrets.randbits(_STEP_BITS)
    return f"{prefix}_{value:016x}"
