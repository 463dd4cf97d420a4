"""Model clients: the ``Model`` protocol, the Anthropic client, the retry policy and rate
limits on model calls.

``AnthropicModel`` is imported on first use: the ``anthropic`` SDK takes about a second to
import, and commands that never call a model (``--help``, ``sessions``, ``show``) skip it.
``PostgresCallLimiter`` needs the ``postgres`` extra.
"""

from typing import TYPE_CHECKING

from anabranch._lazy import lazy_exports as _lazy_exports
from anabranch.models._base import DeltaSink as DeltaSink
from anabranch.models._base import Model as Model
from anabranch.models._base import StreamingModel as StreamingModel
from anabranch.models._retry import RetryPolicy as RetryPolicy

if TYPE_CHECKING:
    from anabranch.models._anthropic import AnthropicModel as AnthropicModel
    from anabranch.models._pg_rate import PostgresCallLimiter as PostgresCallLimiter
    from anabranch.models._provider_limits import ProviderLimit as ProviderLimit
    from anabranch.models._provider_limits import ProviderLimits as ProviderLimits
    from anabranch.models._rate import CallLimiter as CallLimiter
    from anabranch.models._rate import CallRate as CallRate
    from anabranch.models._rate import Charge as Charge
    from anabranch.models._rate import LocalCallLimiter as LocalCallLimiter
    from anabranch.models._rate import RateLimitedModel as RateLimitedModel

__all__ = [
    "AnthropicModel",
    "CallLimiter",
    "CallRate",
    "Charge",
    "DeltaSink",
    "LocalCallLimiter",
    "Model",
    "PostgresCallLimiter",
    "ProviderLimit",
    "ProviderLimits",
    "RateLimitedModel",
    "RetryPolicy",
    "StreamingModel",
]

_RATE = "anabranch.models._rate"
__getattr__, __dir__ = _lazy_exports(
    __name__,
    {
        "AnthropicModel": "anabranch.models._anthropic",
        "CallLimiter": _RATE,
        "CallRate": _RATE,
        "Charge": _RATE,
        "ProviderLimit": "anabranch.models._provider_limits",
        "ProviderLimits": "anabranch.models._provider_limits",
        "LocalCallLimiter": _RATE,
        "RateLimitedModel": _RATE,
        "PostgresCallLimiter": "anabranch.models._pg_rate",
    },
)
