"""A short summary of the crawl, logged (and printed by ``make demo``) when the spider closes."""

from __future__ import annotations

import logging
import time
from typing import Any

from scrapy import signals

logger = logging.getLogger(__name__)


def summarize(stats: dict[str, Any], elapsed: float) -> str:
    pages = stats.get("response_received_count", 0)
    stored = stats.get("item_scraped_count", 0)
    return (
        f"{pages} pages, {stored} items stored "
        f"({stats.get('postgres/inserted', 0)} new, {stats.get('postgres/updated', 0)} updated, "
        f"{stats.get('postgres/unchanged', 0)} unchanged), "
        f"{stats.get('item_rejected_count', 0)} rejected, "
        f"{stats.get('item_duplicates_dropped', 0)} duplicates dropped, "
        f"{stats.get('items/gone', 0)} gone, "
        f"{stats.get('log_count/ERROR', 0)} errors, in {elapsed:.1f} s "
        f"({pages / elapsed if elapsed else 0:.0f} pages/s)"
    )


class CrawlSummary:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.started = time.monotonic()

    @classmethod
    def from_crawler(cls, crawler: Any) -> "CrawlSummary":
        ext = cls(crawler)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    def spider_opened(self) -> None:
        self.started = time.monotonic()

    def spider_closed(self, reason: str) -> None:
        elapsed = time.monotonic() - self.started
        logger.info("Crawl summary (%s): %s", reason, summarize(self.crawler.stats.get_stats(), elapsed))
