"""Store: the batched, idempotent upsert into the item type's table.

The item is passed on only once its batch is committed (see :mod:`scraper.storage.writer`), so
``item_scraped_count`` counts durable rows. Outcomes are counted as ``postgres/inserted``,
``postgres/updated`` (content changed) and ``postgres/unchanged``. A row the database refuses
goes to ``rejects`` with the database's reason; an item the database stayed away for is set
aside with its page (see :mod:`scraper.pipelines.unstored`).
"""

from __future__ import annotations

from typing import Any

from scrapy.exceptions import DropItem
from scrapy.utils.defer import maybe_deferred_to_future

from ..items.base import StoredItem
from ..storage.owner import writer_for
from ..storage.upsert import Row
from ..storage.writer import DatabaseUnavailable, WriteFailed
from .unstored import set_aside
from .validate import reject_record


class StorePipeline:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.writer = writer_for(crawler)

    @classmethod
    def from_crawler(cls, crawler: Any) -> StorePipeline:
        return cls(crawler)

    async def process_item(self, item: Any) -> Any:
        if not isinstance(item, StoredItem):
            return item
        values = item._values
        row = Row(key=tuple([values.get(k) for k in item.key]), values={c: values.get(c) for c in item.columns()})
        stats = self.crawler.stats
        try:
            outcome = await maybe_deferred_to_future(self.writer.add(type(item), row))
        except DatabaseUnavailable as exc:
            raise set_aside(self.crawler, item, exc) from None
        except WriteFailed as exc:
            if not str(exc).startswith("database refused"):
                raise set_aside(self.crawler, item, exc, stop=False) from None
            reasons = [str(exc)]
            stats.inc_value("item_rejected_count")
            stats.inc_value("item_rejected_reasons/database")
            await maybe_deferred_to_future(
                self.writer.add_reject(reject_record(self.crawler.spider.name, item, reasons))
            )
            raise DropItem(f"Rejected ({reasons[0]})", log_level="WARNING") from None
        stats.inc_value(f"postgres/{outcome}")
        return item
