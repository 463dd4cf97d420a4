"""Which cause a cache break gets (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from anabranch.context._cache import CallCacheState, classify_cache_break, expected_cache_read
from anabranch.messages import Usage

BEFORE = CallCacheState(
    model="m",
    system_digest="s",
    tools_digest="t",
    compactions=0,
    started=1000.0,
    usage=Usage(input_tokens=5, cache_read_input_tokens=800, cache_creation_input_tokens=200),
)


def _after(read: int, **changes: object) -> CallCacheState:
    state = replace(BEFORE, started=1010.0, usage=Usage(cache_read_input_tokens=read))
    return replace(state, **changes)  # type: ignore[arg-type]


def test_reading_everything_the_previous_call_left_is_no_break() -> None:
    assert expected_cache_read(BEFORE.usage) == 1000
    assert classify_cache_break(BEFORE, _after(1000), ttl="5m") is None
    assert classify_cache_break(BEFORE, _after(1500, model="x"), ttl="5m") is None


@pytest.mark.parametrize(
    ("changes", "cause"),
    [
        ({"model": "other"}, "model_changed"),
        ({"tools_digest": "t2", "system_digest": "s2"}, "tools_changed"),
        ({"compactions": 1, "system_digest": "s2"}, "compaction"),
        ({"system_digest": "s2"}, "system_changed"),
        ({"started": 1000.0 + 301}, "ttl_expired"),
        ({}, "unknown"),
    ],
)
def test_cause(changes: dict[str, object], cause: str) -> None:
    assert classify_cache_break(BEFORE, _after(100, **changes), ttl="5m") == cause


def test_idle_within_a_1h_ttl_is_not_expiry() -> None:
    assert classify_cache_break(BEFORE, _after(100, started=1000.0 + 900), ttl="1h") == "unknown"
