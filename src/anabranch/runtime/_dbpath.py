"""What may name a database: a file path, never ``:memory:`` or a SQLite URI."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from anabranch.errors import UserError

__all__ = ["database_path"]


def database_path(db: str | os.PathLike[str]) -> Path:
    """``db`` as a file path; ``:memory:``, an empty name, SQLite URIs and anything that is
    not a regular file (``/dev/null``, a directory) are refused: a session must survive its
    process, and a URI would be taken for a file name."""
    text = os.fspath(db)
    if not text or not text.strip():
        raise UserError("the database path is empty")
    if text == ":memory:" or text.startswith("file:"):
        raise UserError(
            f"{text!r} is not a file path: anabranch keeps sessions in a SQLite file so that "
            "they survive the process; give a path (e.g. runs.db)"
        )
    path = Path(text)
    try:
        mode = path.stat().st_mode
    except OSError:  # missing (created later) or unreadable (the store says why)
        return path
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise UserError(f"{text} is {kind}: the database must be a regular file")
    return path
