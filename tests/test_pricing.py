"""The price table: lookup, cache multipliers, overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest

from anabranch.context._pricing import ModelPrice, PriceTable
from anabranch.messages import Usage


def test_cache_prices_follow_the_api_multipliers() -> None:
    table = PriceTable({"m": ModelPrice(input=3, output=15)})
    usage = Usage(
        input_tokens=1_000_000,
        output_tokens=1_000_000,
        cache_read_input_tokens=1_000_000,
        cache_creation_input_tokens=2_000_000,
        cache_creation_5m_input_tokens=1_000_000,
        cache_creation_1h_input_tokens=1_000_000,
    )
    cost = table.cost("m", usage)
    assert cost is not None
    assert cost.uncached == pytest.approx(3.0)
    assert cost.cache_read == pytest.approx(0.30)
    assert cost.cache_write == pytest.approx(3.75 + 6.0)
    assert cost.output == pytest.approx(15.0)
    assert cost.total == pytest.approx(3 + 0.3 + 9.75 + 15)


def test_unsplit_cache_writes_count_as_5m() -> None:
    table = PriceTable({"m": ModelPrice(input=1, output=5)})
    cost = table.cost("m", Usage(cache_creation_input_tokens=1_000_000))
    assert cost is not None and cost.cache_write == pytest.approx(1.25)


def test_explicit_read_price_wins() -> None:
    table = PriceTable({"m": ModelPrice(input=2, output=10, cache_read=0.1)})
    cost = table.cost("m", Usage(cache_read_input_tokens=1_000_000))
    assert cost is not None and cost.cache_read == pytest.approx(0.1)


def test_dated_and_variant_ids_find_their_family() -> None:
    table = PriceTable()
    assert table.price("claude-sonnet-4-5-20250929") == table.price("claude-sonnet-4-5")
    assert table.price("claude-opus-4-8[1m]") == table.price("claude-opus-4-8")
    assert table.price("claude-opus-4-5") != table.price("claude-opus-4")  # exact entry wins
    assert table.price("claude-opus-4-9") is None  # not silently priced as claude-opus-4
    assert table.cost("my-local-model", Usage(input_tokens=10)) is None


def test_overrides_from_mapping_and_json(tmp_path: Path) -> None:
    table = PriceTable().with_prices({"claude-sonnet-4-5": {"input": 1, "output": 2}})
    assert table.price("claude-sonnet-4-5") == ModelPrice(input=1, output=2)
    assert table.price("claude-haiku-4-5") is not None  # defaults kept
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"local": {"input": 0.5, "output": 1, "cache_read": 0}}))
    loaded = PriceTable.from_json(path)
    assert loaded.price("local") == ModelPrice(input=0.5, output=1, cache_read=0)
    assert PriceTable.from_json('{"x": {"input": 1, "output": 1}}').price("x") is not None


@pytest.mark.parametrize(
    "bad",
    ['{"m": {"input": -1, "output": 1}}', '{"m": {"input": 1}}', '{"m": 3}', "{not json"],
)
def test_bad_prices_are_rejected(bad: str) -> None:
    with pytest.raises(pydantic.ValidationError):
        PriceTable.from_json(bad)


_USAGES = [
    Usage(),
    Usage(input_tokens=1234, output_tokens=567),
    Usage(input_tokens=7, cache_read_input_tokens=90_001, cache_creation_input_tokens=3_333),
    Usage(
        input_tokens=11,
        output_tokens=13,
        cache_read_input_tokens=17,
        cache_creation_input_tokens=1_000_019,
        cache_creation_5m_input_tokens=23,
        cache_creation_1h_input_tokens=1_000_000,
    ),
]
_MODELS = [
    "claude-sonnet-4-5",
    "claude-sonnet-4-5-20250929",
    "claude-3-haiku-20240307",
    "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
    "global.anthropic.claude-opus-4-1-v1:0",
    "bench-model",
]


@pytest.mark.parametrize("model", _MODELS)
def test_cost_usd_is_the_cost_total_and_resolving_once_changes_nothing(model: str) -> None:
    """What is charged per call (``cost_usd``, its price resolved once per model id) is the
    very float ``cost().total`` gives, on the first call and every later one, and the
    same a fresh table resolves."""
    table = PriceTable()
    for _ in range(3):
        for usage in _USAGES:
            fresh = PriceTable().cost(model, usage)
            assert table.cost(model, usage) == fresh
            assert table.cost_usd(model, usage) == (fresh.total if fresh is not None else None)
    assert table.price(model) == PriceTable().price(model)


def test_a_table_cannot_change_under_its_resolved_prices() -> None:
    table = PriceTable({"m": ModelPrice(input=1, output=5)})
    assert table.price("m-20250101") is not None
    with pytest.raises(TypeError):
        table.prices["m-2"] = ModelPrice(input=2, output=2)  # type: ignore[index]
    changed = table.with_prices({"m": {"input": 2, "output": 10}})
    assert changed.price("m-20250101") == ModelPrice(input=2, output=10)
    assert table.price("m-20250101") == ModelPrice(input=1, output=5)
