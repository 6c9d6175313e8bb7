"""Stamp each stored item with the page it came from and when it was yielded; count items.

The dedupe pipeline needs to tell "the same page again" (a retry or a redelivery) from "another
page with the same entity", a reject is more useful with its page, and the metrics time each
item from yield to commit. Pipelines never see the response, so the spider middleware layer,
which sees both, records it.
"""

from __future__ import annotations

import time
from typing import Any, AsyncIterator

from itemadapter import is_item
from scrapy import Request

from ..items.base import StoredItem


class ItemOriginMiddleware:
    def __init__(self, stats: Any) -> None:
        self.stats = stats

    @classmethod
    def from_crawler(cls, crawler: Any) -> "ItemOriginMiddleware":
        return cls(crawler.stats)

    def _stamp(self, obj: Any, response: Any) -> None:
        # Our own items first: is_item() asks every itemadapter adapter in turn.
        if not isinstance(obj, StoredItem):
            if not isinstance(obj, Request) and is_item(obj):
                self.stats.inc_value("items/yielded")
            return
        self.stats.inc_value("items/yielded")
        obj._yielded_at = time.monotonic()
        if response is not None:
            obj._origin = response.url
            # Kept so that a page whose items cannot be stored can be dead-lettered.
            obj._request = response.request

    async def process_spider_output_async(self, response: Any, result: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for obj in result:
            self._stamp(obj, response)
            yield obj

    def process_spider_output(self, response: Any, result: Any) -> Any:
        for obj in result:
            self._stamp(obj, response)
            yield obj
