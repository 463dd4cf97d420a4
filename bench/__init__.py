"""Benchmarks for anabranch (not part of the test suite). Run ``python bench/run.py``."""
