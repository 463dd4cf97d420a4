"""A local tracing UI: Arize Phoenix, started offline by ``anabranch ui`` (extra ``ui``)."""

from anabranch.ui._phoenix import PhoenixInfo as PhoenixInfo
from anabranch.ui._phoenix import PhoenixServer as PhoenixServer
from anabranch.ui._phoenix import running_phoenix as running_phoenix

__all__ = ["PhoenixInfo", "PhoenixServer", "running_phoenix"]
