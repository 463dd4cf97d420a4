"""The package version (a module of its own, so any layer may read it)."""

VERSION = "0.1.0"
