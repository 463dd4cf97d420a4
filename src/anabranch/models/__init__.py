"""Model clients: the ``Model`` protocol, the Anthropic client and the retry policy.

``AnthropicModel`` is imported on first use: the ``anthropic`` SDK takes about a second to
import, and commands that never call a model (``--help``, ``sessions``, ``show``) skip it.
"""

from typing import TYPE_CHECKING

from anabranch._lazy import lazy_exports as _lazy_exports
from anabranch.models._base import DeltaSink as DeltaSink
from anabranch.models._base import Model as Model
from anabranch.models._base import StreamingModel as StreamingModel
from anabranch.models._retry import RetryPolicy as RetryPolicy

if TYPE_CHECKING:
    from anabranch.models._anthropic import AnthropicModel as AnthropicModel

__all__ = ["AnthropicModel", "DeltaSink", "Model", "RetryPolicy", "StreamingModel"]

__getattr__, __dir__ = _lazy_exports(__name__, {"AnthropicModel": "anabranch.models._anthropic"})
