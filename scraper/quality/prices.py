"""Price distribution per currency, as a histogram the nodes of a run can add up.

A median cannot be summed over nodes, a histogram can: prices fall in logarithmic buckets,
``BUCKETS_PER_DOUBLING`` per doubling (each about 4 % wide), so the median of the fleet's
histogram is within a bucket of the true one, whatever the range of prices. Free items (0)
have their own bucket. Figures: ``price/<CUR>/<bucket>`` -> count.
"""

from __future__ import annotations

import math
from collections import Counter
from decimal import Decimal
from typing import Any

PREFIX = "price/"
BUCKETS_PER_DOUBLING = 16
ZERO = "zero"


def bucket(price: float) -> str:
    if price <= 0:
        return ZERO
    return str(math.floor(math.log2(price) * BUCKETS_PER_DOUBLING))


def bucket_value(name: str) -> float:
    """The middle of a bucket (geometric), the value a median in it is reported as."""
    if name == ZERO:
        return 0.0
    return 2 ** ((int(name) + 0.5) / BUCKETS_PER_DOUBLING)


class PriceHistogram:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def add(self, item: Any) -> None:
        fields = getattr(item, "fields", {})
        # One price per item: the price a parser most often gets wrong.
        if "price" not in fields or fields["price"].get("clean") != "price" or "currency" not in fields:
            return
        currency = item.get("currency")
        value = item.get("price")
        if isinstance(value, (int, float, Decimal)) and currency:
            self.counts[f"{PREFIX}{currency}/{bucket(float(value))}"] += 1

    def figures(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.counts.items()}


def medians(figures: dict[str, float]) -> dict[str, tuple[float, int]]:
    """Currency -> (median price, prices counted), from a run's figures."""
    per_currency: dict[str, list[tuple[str, float]]] = {}
    for key, count in figures.items():
        if key.startswith(PREFIX):
            currency, _, name = key[len(PREFIX):].partition("/")
            per_currency.setdefault(currency, []).append((name, count))
    out: dict[str, tuple[float, int]] = {}
    for currency, buckets in per_currency.items():
        buckets.sort(key=lambda b: -math.inf if b[0] == ZERO else int(b[0]))
        total = sum(count for _, count in buckets)
        if total <= 0:
            continue
        seen = 0.0
        for name, count in buckets:
            seen += count
            if seen >= total / 2:
                out[currency] = (bucket_value(name), int(total))
                break
    return out
