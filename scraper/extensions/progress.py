"""A progress line during long crawls, replacing Scrapy's LogStats.

Every ``LOGSTATS_INTERVAL`` seconds (60): pages and stored items with their per-minute rates,
rejects and duplicates, and the shared queue's depth and oldest request, which is what tells
whether a fleet is keeping up.
"""

from __future__ import annotations

import logging
from typing import Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

from ..backends.redis_client import get_redis
from ..queue.queues import frontier

logger = logging.getLogger(__name__)


class ProgressLog:
    def __init__(self, crawler: Any, interval: float) -> None:
        self.crawler = crawler
        self.interval = interval
        self.server = get_redis(crawler.settings["REDIS_URL"])
        self._task: Any = None
        self._last = (0, 0)

    @classmethod
    def from_crawler(cls, crawler: Any) -> ProgressLog:
        interval = crawler.settings.getfloat("LOGSTATS_INTERVAL", 60.0)
        if not interval:
            raise NotConfigured
        ext = cls(crawler, interval)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    def spider_opened(self, spider: Any) -> None:
        from twisted.internet import task

        self.spider = spider
        self._task = task.LoopingCall(self.log)
        self._task.start(self.interval, now=False)

    def spider_closed(self) -> None:
        if self._task is not None and self._task.running:
            self._task.stop()

    def log(self) -> None:
        stats = self.crawler.stats
        pages = stats.get_value("response_received_count", 0)
        items = stats.get_value("item_scraped_count", 0)
        per_minute = 60.0 / self.interval
        pages_rate = (pages - self._last[0]) * per_minute
        items_rate = (items - self._last[1]) * per_minute
        self._last = (pages, items)
        try:
            frontier_queue = frontier(self.server, self.spider, self.crawler.settings)
            depth, age = len(frontier_queue), frontier_queue.oldest_age()
            queue = f"queue {depth} (oldest {age:.0f} s)"
        except Exception as exc:  # progress must not take the crawl down
            queue = f"queue unavailable ({exc})"
        logger.info(
            "Progress: %d pages (%.0f/min), %d items stored (%.0f/min), %d rejected, %d duplicates; %s",
            pages,
            pages_rate,
            items,
            items_rate,
            stats.get_value("item_rejected_count", 0),
            stats.get_value("item_duplicates_dropped", 0),
            queue,
        )
