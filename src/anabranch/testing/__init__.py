"""Test doubles users test their agents with: offline models and a local Messages API."""

from anabranch.testing.models import FunctionModel as FunctionModel
from anabranch.testing.models import TestModel as TestModel
from anabranch.testing.models import arguments_for_schema as arguments_for_schema

__all__ = ["FunctionModel", "TestModel", "arguments_for_schema"]
