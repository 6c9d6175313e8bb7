"""Field coverage: of the items a run stored, how many had each field filled, per item type.

Counted in memory as items are stored (Scrapy's ``item_scraped``, which the store pipeline only
lets through once the row is committed), so counting costs no query. The counts travel with the
run's other quality figures (:mod:`.figures`), so a fleet's coverage is the sum of its nodes'.

Figures: ``coverage/<ItemType>/items`` and ``coverage/<ItemType>/<field>``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

PREFIX = "coverage/"


def filled(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, (str, bytes, list, tuple, dict, set)):
        return bool(value.strip() if isinstance(value, str) else value)
    return True


class CoverageCounter:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def add(self, item: Any) -> None:
        fields = item.columns() if hasattr(item, "columns") else item.fields
        name = type(item).__name__
        self.counts[f"{PREFIX}{name}/items"] += 1
        for field in fields:
            if filled(item.get(field)):
                self.counts[f"{PREFIX}{name}/{field}"] += 1

    def figures(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.counts.items()}


def ratios(figures: dict[str, float], item_fields: dict[str, list[str]]) -> dict[tuple[str, str], float]:
    """(item type, field) -> share of stored items with the field filled, for every item type
    with stored items; *item_fields* names each type's fields (a field never filled is 0)."""
    out: dict[tuple[str, str], float] = {}
    for item_type, fields in item_fields.items():
        items = figures.get(f"{PREFIX}{item_type}/items", 0.0)
        if items <= 0:
            continue
        for field in fields:
            out[(item_type, field)] = figures.get(f"{PREFIX}{item_type}/{field}", 0.0) / items
    return out


def item_counts(figures: dict[str, float]) -> dict[str, float]:
    """Item type -> items stored, from a run's figures."""
    return {key[len(PREFIX):-len("/items")]: value for key, value in figures.items()
            if key.startswith(PREFIX) and key.endswith("/items")}


def fields_seen(figures: dict[str, float]) -> dict[str, set[str]]:
    """Item type -> the fields some stored item had filled, from a run's figures."""
    out: dict[str, set[str]] = {}
    for key in figures:
        if key.startswith(PREFIX) and not key.endswith("/items"):
            item_type, _, field = key[len(PREFIX):].partition("/")
            out.setdefault(item_type, set()).add(field)
    return out
