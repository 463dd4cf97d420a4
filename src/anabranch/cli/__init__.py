"""The ``anabranch`` command line: one module per command group."""

from anabranch.cli._main import main as main

__all__ = ["main"]
