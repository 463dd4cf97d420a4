"""Every exception anabranch raises on purpose.

    AnabranchError
    ├── UserError                 a mistake in how the library is called
    │   ├── SessionNotFoundError  no session with that id in the store
    │   └── ToolDefinitionError   a function cannot be turned into a tool
    ├── StoreError                the store failed (I/O, disk full, a broken write); no raw
    │   │                         driver error (``sqlite3.Error``, ...) escapes a store
    │   └── DatabaseError         the file is not an anabranch database, is newer, or is corrupt
    ├── SessionError              a session cannot be driven by this process now
    │   ├── SessionBusyError      another live process holds the session's lease
    │   └── LeaseLostError        it was taken over while this process was stalled
    ├── ApprovalPendingError      a run paused: tool calls wait for approval (resumable)
    ├── RunError                  a run could not finish
    │   ├── RunFailedError        ``result.raise_for_status()`` of a session that ended failed
    │   ├── MaxTurnsExceeded
    │   ├── OutputValidationError the answer never matched the agent's output_type
    │   ├── BudgetExceeded        a budget is used up (on_limit="fail", or none left to start)
    │   └── CompactionFailedError the compaction circuit breaker tripped with policy "fail"
    └── ModelError                raised by model clients, at their boundary
        ├── ModelConnectionError  the request never got an HTTP answer (retryable)
        └── ModelAPIError         the API answered with an error
            ├── RateLimitedError  429 (retryable; carries retry_after)
            ├── OverloadedError   529 or a mid-stream overloaded_error (retryable)
            ├── ServerError       5xx (retryable)
            └── PromptTooLongError  the prompt is over the window of the model or the
                                    channel ("prompt is too long: N tokens > M maximum",
                                    a gateway's "Max Input Tokens=M, Got=N", ...)

Invalid definitions (agents, policies, graphs) raise pydantic's ``ValidationError``.

A session that runs and fails is not an exception: ``run``, ``resume`` and ``run_graph``
return a result with ``status="failed"`` (and ``error``); ``result.raise_for_status()``
raises ``RunFailedError`` carrying it, chained to the original exception when the failure
happened in this process.
"""

from __future__ import annotations

import re
from typing import Protocol

__all__ = [
    "AnabranchError",
    "ApprovalPendingError",
    "BudgetExceeded",
    "CompactionFailedError",
    "DatabaseError",
    "LeaseLostError",
    "MaxTurnsExceeded",
    "ModelAPIError",
    "ModelConnectionError",
    "ModelError",
    "OutputValidationError",
    "OverloadedError",
    "PromptTooLongError",
    "RateLimitedError",
    "RunError",
    "RunFailedError",
    "ServerError",
    "SessionBusyError",
    "SessionError",
    "SessionNotFoundError",
    "StoreError",
    "ToolDefinitionError",
    "UserError",
]


class AnabranchError(Exception):
    """Root of every error anabranch raises on purpose."""

    session_id: str | None = None
    """The session the error happened in, when there is one (resume it by this id)."""


class UserError(AnabranchError):
    """The library was called in a way that cannot work."""


class SessionNotFoundError(UserError):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"no session with id {session_id!r} in this database")
        self.session_id = session_id


class StoreError(AnabranchError):
    """A store operation failed. The store stays consistent: the failed write left nothing.

    The driver's own exception (``sqlite3.Error``, ...) is the ``__cause__``."""


class DatabaseError(StoreError):
    """The database file cannot be used (not anabranch's, newer schema, corrupt)."""


class SessionError(AnabranchError):
    """A session cannot be driven by this process now (someone else drives it)."""


class SessionBusyError(SessionError):
    def __init__(self, session_id: str, owner: str) -> None:
        super().__init__(
            f"session {session_id} is being driven by another live process ({owner}); "
            "wait for it to finish or stop it first"
        )
        self.session_id = session_id
        self.owner = owner


class LeaseLostError(SessionError):
    """This process stalled past its lease and another process took the session over."""

    def __init__(self, session_id: str, owner: str) -> None:
        super().__init__(
            f"session {session_id} was taken over by another process while this one was "
            "stalled past its lease; this process stopped driving it",
        )
        self.session_id = session_id
        self.owner = owner


class ToolDefinitionError(UserError):
    """A Python function cannot be turned into a tool."""


class ApprovalPendingError(AnabranchError):
    """The session paused: tool calls wait for a person's answer. Nothing is lost; answer
    with ``Runtime.approve`` (or ``anabranch approve``), then ``resume`` the session."""

    def __init__(self, calls: list[tuple[str, str, str]]) -> None:
        names = ", ".join(f"{tool} ({call_id})" for _, call_id, tool in calls)
        super().__init__(f"waiting for approval of {names}")
        self.calls = calls
        """``(run_id, call_id, tool)`` of each waiting call."""


class RunError(AnabranchError):
    """A run could not finish."""


class _Outcome(Protocol):
    """What ``RunFailedError`` carries: a ``RunResult`` (or ``GraphResult``)."""

    @property
    def session_id(self) -> str: ...
    @property
    def agent(self) -> str: ...
    @property
    def error(self) -> str | None: ...


class RunFailedError(RunError):
    """A session ended ``failed``. ``result`` is its full result; ``__cause__`` is the
    exception that failed it when that happened in this process."""

    def __init__(self, result: _Outcome) -> None:
        error = result.error or "no error text"
        super().__init__(f"{result.agent} failed in session {result.session_id}: {error}")
        self.result = result
        self.session_id = result.session_id


class MaxTurnsExceeded(RunError):
    def __init__(self, agent: str, max_turns: int) -> None:
        super().__init__(f"agent {agent!r} reached max_turns={max_turns} without a final answer")
        self.agent = agent
        self.max_turns = max_turns


class OutputValidationError(RunError):
    """An ``output_type`` agent's answer still failed validation after its retries."""

    def __init__(self, agent: str, attempts: int, errors: str) -> None:
        super().__init__(
            f"agent {agent!r} gave no answer matching its output_type after {attempts} "
            f"attempts; last errors:\n{errors}"
        )
        self.agent = agent
        self.attempts = attempts


class BudgetExceeded(RunError):
    """A budget is used up: a run with ``on_limit="fail"`` reached it, or there was no
    budget left to start a run."""

    def __init__(self, message: str, *, scope: str = "") -> None:
        super().__init__(message)
        self.scope = scope
        """Which budget: ``session``, ``tenant <name>`` or ``agent <name>``."""


class CompactionFailedError(RunError):
    """Compaction failed too many times in a row and the policy says to stop."""


class ModelError(AnabranchError):
    """A model call failed. ``retryable`` says whether trying again may help."""

    retryable: bool = False


class ModelConnectionError(ModelError):
    retryable = True


class ModelAPIError(ModelError):
    """The model API answered with an error."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        error_type: str | None = None,
        retry_after: float | None = None,
        request_id: str | None = None,
        gateway: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.error_type = error_type
        self.retry_after = retry_after
        self.request_id = request_id
        self.gateway = gateway
        """The gateway the answer came through (``"litellm"``, ...), seen in its headers."""


class RateLimitedError(ModelAPIError):
    retryable = True


class OverloadedError(ModelAPIError):
    retryable = True


class ServerError(ModelAPIError):
    retryable = True


_TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")


class PromptTooLongError(ModelAPIError):
    """The request exceeded the context window of the model or of the channel to it.

    ``maximum`` is the limit the error states and ``tokens`` the channel's own count of
    the rejected prompt, each ``None`` when the wording does not say.
    """

    def __init__(
        self,
        message: str,
        *,
        maximum: int | None = None,
        tokens: int | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]
        match = _TOO_LONG.search(message)
        self.tokens: int | None = (
            tokens if tokens is not None else (int(match.group(1)) if match else None)
        )
        self.maximum: int | None = (
            maximum if maximum is not None else (int(match.group(2)) if match else None)
        )

    @staticmethod
    def matches(message: str) -> bool:
        return "prompt is too long" in message
