"""What the spans carry beyond their names: message content (opt-in) and which
OpenInference keys go next to the GenAI ones.

Phoenix (20.x) derives the OpenInference keys it shows from the GenAI names itself: the span
kind of ``chat``, ``execute_tool`` and ``invoke_agent`` spans, ``session.id`` from
``gen_ai.conversation.id``, ``llm.model_name``/``llm.provider``/``llm.system`` from the
request model and provider, ``llm.token_count.*`` from ``gen_ai.usage.*`` (the cache-write
count from its former name ``cache_creation``), ``tool.name``/``tool.id`` of a tool span. So
by default (``"minimal"``) spans carry only the OpenInference keys it cannot derive (the
kind of a compaction, graph or memory span, ``agent.name``, the reasoning-token count,
``input``/``output.value``); ``"full"`` adds every duplicate too, for a backend that reads
OpenInference keys only.
"""

from __future__ import annotations

import os
from typing import Literal, get_args

from anabranch.errors import UserError

__all__ = [
    "CONTENT_ENV",
    "OPENINFERENCE_ENV",
    "OpenInference",
    "PROVIDER",
    "content_capture_from_env",
    "openinference_full",
]

PROVIDER = "anthropic"
"""``gen_ai.provider.name`` of every span."""
CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_CONTENT_ON = {"true", "1", "yes", "span_only", "span_and_event"}
OPENINFERENCE_ENV = "ANABRANCH_OPENINFERENCE"

OpenInference = Literal["minimal", "full"]
"""``minimal``: only the OpenInference keys Phoenix cannot derive from the GenAI names;
``full``: every OpenInference key as well."""
_CHOICES: tuple[str, ...] = get_args(OpenInference)


def content_capture_from_env() -> bool:
    """Message content in spans is opt-in via OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT.

    ``true``/``1``, ``SPAN_ONLY`` and ``SPAN_AND_EVENT`` turn it on; anything else (including
    the default ``NO_CONTENT``) keeps it off.
    """
    return os.environ.get(CONTENT_ENV, "").strip().lower() in _CONTENT_ON


def openinference_full(choice: str | None = None) -> bool:
    """Whether spans carry every OpenInference key: ``choice``, else ``$ANABRANCH_OPENINFERENCE``
    (unset or empty: ``minimal``). Anything but ``minimal``/``full`` is a ``UserError``."""
    source = "openinference"
    if choice is None:
        source, choice = OPENINFERENCE_ENV, os.environ.get(OPENINFERENCE_ENV, "").strip().lower()
        choice = choice or "minimal"
    if choice not in _CHOICES:
        raise UserError(f"{source} must be one of {', '.join(_CHOICES)}, not {choice!r}")
    return choice == "full"
