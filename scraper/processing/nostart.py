"""A processor sends no start requests: the fetchers seed the crawl, a processor only answers entries."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from scrapy.exceptions import NotConfigured

from .config import read_config


class NoStartRequests:
    @classmethod
    def from_crawler(cls, crawler: Any) -> NoStartRequests:
        if not read_config(crawler.settings).processor:
            raise NotConfigured
        return cls()

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        return
        yield  # an async generator that yields nothing
