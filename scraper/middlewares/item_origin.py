"""Stamp each stored item with the page it came from.

The dedupe pipeline needs to tell "the same page again" (a retry or a redelivery) from "another
page with the same entity", and a reject is more useful with its page. Pipelines never see the
response, so the spider middleware layer, which sees both, records it.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from ..items.base import StoredItem


class ItemOriginMiddleware:
    async def process_spider_output_async(self, response: Any, result: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for obj in result:
            if isinstance(obj, StoredItem) and response is not None:
                obj._origin = response.url
            yield obj

    def process_spider_output(self, response: Any, result: Any) -> Any:
        for obj in result:
            if isinstance(obj, StoredItem) and response is not None:
                obj._origin = response.url
            yield obj
