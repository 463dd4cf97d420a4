"""Tracing: the only package that knows span names and attribute keys (OTel API only)."""

from anabranch.traces.spans import Tracing as Tracing

__all__ = ["Tracing"]
