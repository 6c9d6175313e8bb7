"""A field's own cleaner, as the clean pipeline runs it: what a repair compares with stored values.

A node holds a field's value when the project's cleaning reads exactly the stored value from its
text: ``"1.299,00 €"`` holds the price 1299.00 on a German page. The text goes into an empty
item of the type, through a clean pipeline of its own (the crawl's keeps per-page state on the
reactor thread), and the field is read back; text the cleaner cannot read holds no value.
"""

from __future__ import annotations

from typing import Any

from ..items.base import StoredItem
from ..pipelines.clean import CleanPipeline


class FieldCleaner:
    """A price whose currency goes to a field of its own reads as ``(amount, currency)``, and is
    known as the stored pair: a node that says "190.93" with no mark reads the spider's default
    currency, which must be the one stored (a repair that read the amount right and took the
    currency from the default would store a wrong currency on every page of another one)."""

    def __init__(self, crawler: Any, item_type: type[StoredItem], field: str) -> None:
        self.pipeline = CleanPipeline(crawler)
        self.item_type = item_type
        self.field = field
        currency = item_type.price_fields().get(field)
        self.companion = currency if currency in item_type.columns() else None
        self._problems = tuple(f"{name}:" for name in (field, self.companion) if name)

    def __call__(self, raw: str) -> Any:
        item = self.item_type()
        item[self.field] = raw
        self.pipeline.process_item(item)
        if any(p.startswith(self._problems) for p in getattr(item, "_problems", ())):
            return None
        value = item._values.get(self.field)
        if self.companion is None or value is None:
            return value
        return (value, item._values.get(self.companion))
