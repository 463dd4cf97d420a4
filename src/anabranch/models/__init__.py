"""Model clients: the ``Model`` protocol, the Anthropic client and the retry policy."""

from anabranch.models._anthropic import AnthropicModel as AnthropicModel
from anabranch.models._base import DeltaSink as DeltaSink
from anabranch.models._base import Model as Model
from anabranch.models._base import StreamingModel as StreamingModel
from anabranch.models._retry import RetryPolicy as RetryPolicy

__all__ = ["AnthropicModel", "DeltaSink", "Model", "RetryPolicy", "StreamingModel"]
