"""What a finished run hands back."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from anabranch.context.messages import Usage

__all__ = ["RunResult"]


class RunResult(BaseModel):
    """The outcome of ``Runtime.run`` / ``Runtime.resume``."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    run_id: str
    agent: str
    status: Literal["done", "failed"]
    output: str
    usage: Usage
    """Token usage of the whole session (every agent run in it)."""
    error: str | None = None
