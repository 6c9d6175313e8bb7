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
    if type(value) is str:  # nearly every field: before the general checks
        return bool(value.strip())
    if value is None:
        return False
    if isinstance(value, (str, bytes, list, tuple, dict, set)):
        return bool(value.strip() if isinstance(value, str) else value)
    return True


class CoverageCounter:
    def __init__(self) -> None:
        # Per item type: its field names, then items counted and each field's count. The figure
        # names are built when asked for, not once per item and field.
        self._types: dict[type, tuple[str, tuple[str, ...], list[int]]] = {}

    def add(self, item: Any) -> None:
        kind = type(item)
        entry = self._types.get(kind)
        if entry is None:
            fields = tuple(item.columns() if hasattr(item, "columns") else item.fields)
            entry = self._types[kind] = (kind.__name__, fields, [0] * (len(fields) + 1))
        _name, fields, counts = entry
        counts[0] += 1
        # A scrapy Item's own dict (what StoredItem.get reads) rather than a method call per field.
        values = getattr(item, "_values", None)
        get = values.get if type(values) is dict else item.get
        for i, field in enumerate(fields, 1):
            if filled(get(field)):
                counts[i] += 1

    @property
    def counts(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for name, fields, counts in self._types.values():
            out[f"{PREFIX}{name}/items"] += counts[0]
            for field, count in zip(fields, counts[1:]):
                if count:
                    out[f"{PREFIX}{name}/{field}"] += count
        return out

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
    return {
        key[len(PREFIX) : -len("/items")]: value
        for key, value in figures.items()
        if key.startswith(PREFIX) and key.endswith("/items")
    }


def fields_seen(figures: dict[str, float]) -> dict[str, set[str]]:
    """Item type -> the fields some stored item had filled, from a run's figures."""
    out: dict[str, set[str]] = {}
    for key in figures:
        if key.startswith(PREFIX) and not key.endswith("/items"):
            item_type, _, field = key[len(PREFIX) :].partition("/")
            out.setdefault(item_type, set()).add(field)
    return out
