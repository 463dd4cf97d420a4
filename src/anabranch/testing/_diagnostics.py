"""Cache diagnostics as the API gives them: why a request's prompt diverged from the
request whose response ``diagnostics.previous_message_id`` names."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from anabranch.context._tokens import estimate_request
from anabranch.messages import ModelRequest, canonical_json

__all__ = ["CacheDiagnostics"]

_REMEMBERED = 1024


def _prompt(request: ModelRequest) -> tuple[str, str]:
    system = canonical_json([b.text for b in request.system])
    tools = canonical_json([[t.name, t.description, t.input_schema] for t in request.tools])
    return system, tools


class CacheDiagnostics:
    """Remembers recent requests by the id of their response; explains divergences."""

    def __init__(self) -> None:
        self._requests: OrderedDict[str, ModelRequest] = OrderedDict()

    def remember(self, response_id: str, request: ModelRequest) -> None:
        self._requests[response_id] = request
        while len(self._requests) > _REMEMBERED:
            self._requests.popitem(last=False)

    def explain(self, previous_id: str | None, request: ModelRequest) -> dict[str, Any]:
        """The ``diagnostics`` object of a response (``cache_miss_reason`` null: no miss)."""
        if previous_id is None:
            return {"cache_miss_reason": None}
        previous = self._requests.get(previous_id)
        if previous is None:
            return {"cache_miss_reason": {"type": "previous_message_not_found"}}
        missed = estimate_request(previous)
        reason: str | None = None
        if previous.model != request.model:
            reason = "model_changed"
        elif _prompt(previous)[1] != _prompt(request)[1]:
            reason = "tools_changed"
        elif _prompt(previous)[0] != _prompt(request)[0]:
            reason = "system_changed"
        elif request.messages[: len(previous.messages)] != previous.messages:
            reason = "messages_changed"
        if reason is None:
            return {"cache_miss_reason": None}
        return {"cache_miss_reason": {"type": reason, "cache_missed_input_tokens": missed}}
