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
    def __init__(self, crawler: Any, item_type: type[StoredItem], field: str) -> None:
        self.pipeline = CleanPipeline(crawler)
        self.item_type = item_type
        self.field = field
        self._problem = f"{field}:"

    def __call__(self, raw: str) -> Any:
        item = self.item_type()
        item[self.field] = raw
        self.pipeline.process_item(item)
        if any(p.startswith(self._problem) for p in getattr(item, "_problems", ())):
            return None
        return item._values.get(self.field)
