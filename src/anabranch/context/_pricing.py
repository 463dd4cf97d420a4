"""Estimated cost of model calls from a per-model price table (USD per million tokens).

Cache prices default to the Messages API multipliers of the base input price: a 5-minute
write costs 1.25x, a 1-hour write 2x, a read 0.1x. A model whose read price differs (some
newer models read for less) sets it explicitly. The table is an estimate, not a bill: check
the provider's pricing page, and override entries with ``PriceTable.with_prices`` or a JSON
file (``PriceTable.from_json``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from anabranch.messages import Usage

__all__ = [
    "CACHE_READ_MULTIPLIER",
    "CACHE_WRITE_1H_MULTIPLIER",
    "CACHE_WRITE_5M_MULTIPLIER",
    "DEFAULT_PRICES",
    "Cost",
    "ModelPrice",
    "PriceTable",
    "REGIONAL_PREMIUM",
    "claude_generation",
    "scaled",
]

CACHE_WRITE_5M_MULTIPLIER = 1.25
CACHE_WRITE_1H_MULTIPLIER = 2.0
CACHE_READ_MULTIPLIER = 0.1
_MTOK = 1_000_000
_RESOLVED_MAX = 256
"""Model ids a ``PriceTable`` keeps the resolved price of (ids past that are resolved again
each time: a caller pricing arbitrary ids does not grow the table without bound)."""
_VARIANT = re.compile(r"^(-\d{8}|-latest|@.*|\[.*\])$")
"""What may follow a table key in a model id: a date, ``-latest``, ``@version`` or ``[1m]``."""


class ModelPrice(BaseModel):
    """USD per million tokens for one model. Cache prices default to the API multipliers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_write_5m: float | None = Field(None, ge=0)
    cache_write_1h: float | None = Field(None, ge=0)
    cache_read: float | None = Field(None, ge=0)

    @property
    def write_5m_rate(self) -> float:
        return (
            self.cache_write_5m
            if self.cache_write_5m is not None
            else self.input * CACHE_WRITE_5M_MULTIPLIER
        )

    @property
    def write_1h_rate(self) -> float:
        return (
            self.cache_write_1h
            if self.cache_write_1h is not None
            else self.input * CACHE_WRITE_1H_MULTIPLIER
        )

    @property
    def read_rate(self) -> float:
        return (
            self.cache_read if self.cache_read is not None else self.input * CACHE_READ_MULTIPLIER
        )


@dataclass(frozen=True)
class Cost:
    """Estimated USD cost of some usage, by kind of token."""

    uncached: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0
    output: float = 0.0

    @property
    def total(self) -> float:
        return self.uncached + self.cache_read + self.cache_write + self.output

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.uncached + other.uncached,
            self.cache_read + other.cache_read,
            self.cache_write + other.cache_write,
            self.output + other.output,
        )


def _p(input_: float, output: float, read: float | None = None) -> ModelPrice:
    return ModelPrice(input=input_, output=output, cache_read=read)


DEFAULT_PRICES: Mapping[str, ModelPrice] = {
    # Published list prices (platform.claude.com pricing and model pages, late 2026).
    "claude-fable-5-1": _p(10, 50, read=0.25),
    "claude-fable-5": _p(10, 50),
    "claude-opus-5-5": _p(4, 20),
    "claude-opus-5": _p(5, 25),
    "claude-sonnet-5-5": _p(2, 10, read=0.10),
    "claude-sonnet-5": _p(2, 10),
    "claude-haiku-5-5": _p(0.10, 0.50),  # prompts up to 100k tokens; longer ones cost 5x
    "claude-opus-4-8": _p(5, 25),
    "claude-opus-4-7": _p(5, 25),
    "claude-opus-4-6": _p(5, 25),
    "claude-opus-4-5": _p(5, 25),
    "claude-opus-4-1": _p(15, 75),
    "claude-opus-4-0": _p(15, 75),
    "claude-opus-4": _p(15, 75),
    "claude-sonnet-4-6": _p(3, 15),
    "claude-sonnet-4-5": _p(3, 15),
    "claude-sonnet-4-0": _p(3, 15),
    "claude-sonnet-4": _p(3, 15),
    "claude-3-7-sonnet": _p(3, 15),
    "claude-haiku-4-5": _p(1, 5),
    "claude-3-5-haiku": _p(0.80, 4),
    "claude-3-haiku": _p(0.25, 1.25, read=0.03),
}

_PRICE_MAP = TypeAdapter(dict[str, ModelPrice])

REGIONAL_PREMIUM = 1.1
"""Bedrock and Vertex price regional endpoints 10% above global ones (4.5 generation on)."""
_BEDROCK_ID = re.compile(
    r"^(?:(?P<geo>[a-z]{2,6})\.)?anthropic\.(?P<model>claude-[a-z0-9-]+?)(?:-v\d+(?::\d+)?)?$"
)
_FAMILY = re.compile(r"claude-(?:opus|sonnet|haiku|fable|mythos)-(\d+)(?:-(\d)(?!\d))?")
_OLD_FAMILY = re.compile(r"claude-(\d)(?:-(\d))?-(?:opus|sonnet|haiku)")


def claude_generation(model: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a Claude model id in any channel's spelling, if it names one."""
    for pattern in (_FAMILY, _OLD_FAMILY):
        match = pattern.search(model)
        if match:
            return int(match.group(1)), int(match.group(2) or 0)
    return None


def scaled(price: ModelPrice, factor: float) -> ModelPrice:
    """``price`` with every rate ``factor`` times higher."""
    return ModelPrice(
        input=price.input * factor,
        output=price.output * factor,
        cache_write_5m=price.write_5m_rate * factor,
        cache_write_1h=price.write_1h_rate * factor,
        cache_read=price.read_rate * factor,
    )


class PriceTable:
    """Prices by model id. A key also matches ids that add a date or variant to it
    (``claude-sonnet-4-5`` prices ``claude-sonnet-4-5-20250929``); unknown models cost ``None``.
    """

    def __init__(self, prices: Mapping[str, ModelPrice] | None = None) -> None:
        self.prices: Mapping[str, ModelPrice] = MappingProxyType(
            dict(DEFAULT_PRICES if prices is None else prices)
        )
        """The table's entries, read-only: a table never changes (``with_prices`` makes a
        new one), so what ``price`` resolves for a model id is kept."""
        self._resolved: dict[str, ModelPrice | None] = {}
        """Model id -> its ``price``, as first resolved (a few ids per process: every model
        call is priced, and resolving scans the table)."""

    def with_prices(self, overrides: Mapping[str, ModelPrice | Mapping[str, float]]) -> PriceTable:
        """A copy with ``overrides`` added or replacing entries (validated)."""
        merged = dict(self.prices)
        merged.update(_PRICE_MAP.validate_python(dict(overrides)))
        return PriceTable(merged)

    @classmethod
    def from_json(cls, source: str | Path, *, base: PriceTable | None = None) -> PriceTable:
        """Defaults (or ``base``) overridden by a JSON object ``{"model": {"input": 3, ...}}``.

        ``source`` is a path to a file or the JSON text itself.

        Raises:
            pydantic.ValidationError: malformed JSON or prices.
            OSError: the file cannot be read.
        """
        if isinstance(source, Path) or not source.lstrip().startswith("{"):
            text = Path(source).read_text()
        else:
            text = source
        overrides = _PRICE_MAP.validate_json(text)
        return (base or cls()).with_prices(overrides)

    def price(self, model: str) -> ModelPrice | None:
        """The price entry for ``model`` (exact, else the longest key it extends).

        A Bedrock id (``us.anthropic.claude-sonnet-4-5-20250929-v1:0``) is priced as the
        model it names; a regional or geographic one (any but ``global.``) of the 4.5
        generation or later costs ``REGIONAL_PREMIUM`` times more, as Bedrock and Vertex
        charge (a Vertex id names no region: pass a regional table if you use one).
        """
        resolved = self._resolved
        if model in resolved:
            return resolved[model]
        found = self._resolve(model)
        if len(resolved) < _RESOLVED_MAX:
            resolved[model] = found
        return found

    def _resolve(self, model: str) -> ModelPrice | None:
        found = self._lookup(model)
        if found is not None:
            return found
        match = _BEDROCK_ID.match(model)
        if match is None:
            return None
        found = self._lookup(match.group("model"))
        if found is None or match.group("geo") == "global":
            return found
        generation = claude_generation(match.group("model"))
        if generation is None or generation < (4, 5):
            return found
        return scaled(found, REGIONAL_PREMIUM)

    def _lookup(self, model: str) -> ModelPrice | None:
        if model in self.prices:
            return self.prices[model]
        best: str | None = None
        for key in self.prices:
            if model.startswith(key) and _VARIANT.match(model[len(key) :]):
                if best is None or len(key) > len(best):
                    best = key
        return self.prices[best] if best is not None else None

    def cost(self, model: str, usage: Usage) -> Cost | None:
        """Estimated cost of ``usage`` on ``model``; ``None`` when the model has no price."""
        price = self.price(model)
        if price is None:
            return None
        return Cost(*_cost_terms(price, usage))

    def cost_usd(self, model: str, usage: Usage) -> float | None:
        """``cost(model, usage).total`` (the same float) without the ``Cost`` record; what
        is charged per model call. ``None`` when the model has no price."""
        price = self.price(model)
        if price is None:
            return None
        uncached, cache_read, cache_write, output = _cost_terms(price, usage)
        return uncached + cache_read + cache_write + output


def _cost_terms(price: ModelPrice, usage: Usage) -> tuple[float, float, float, float]:
    """USD of ``usage`` at ``price``: uncached input, cache reads, cache writes, output."""
    split = usage.cache_creation_5m_input_tokens + usage.cache_creation_1h_input_tokens
    unsplit = max(usage.cache_creation_input_tokens - split, 0)  # older APIs: all 5m
    write = (
        usage.cache_creation_5m_input_tokens + unsplit
    ) * price.write_5m_rate + usage.cache_creation_1h_input_tokens * price.write_1h_rate
    return (
        usage.input_tokens * price.input / _MTOK,
        usage.cache_read_input_tokens * price.read_rate / _MTOK,
        write / _MTOK,
        usage.output_tokens * price.output / _MTOK,
    )
