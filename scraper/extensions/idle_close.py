"""Keep a spider alive while the shared queue may still get work; stop it once it stays empty.

A node whose own work is done must not close while other nodes still hold requests in flight
that will enqueue more. It stays open until the shared queue has been empty for
``SCHEDULER_IDLE_TIMEOUT`` seconds, polling every ``SCHEDULER_IDLE_POLL`` seconds (Scrapy's own
heartbeat only looks every 5 s, which would make every crawl end late).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from scrapy import signals
from scrapy.exceptions import DontCloseSpider

from ..adapters import engine
from ..config import get_float

logger = logging.getLogger(__name__)


class IdleClose:
    def __init__(self, crawler: Any, timeout: float, poll: float) -> None:
        self.crawler = crawler
        self.timeout = timeout
        self.poll = poll
        self._idle_since: float | None = None
        self._poke: Any = None

    @classmethod
    def from_crawler(cls, crawler: Any) -> IdleClose:
        timeout = get_float(crawler.settings, "SCHEDULER_IDLE_TIMEOUT", 10.0, minimum=0)
        poll = get_float(crawler.settings, "SCHEDULER_IDLE_POLL", 0.5, minimum=0.05)
        ext = cls(crawler, timeout, min(poll, max(timeout, 0.05)))
        crawler.signals.connect(ext.spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    def spider_idle(self) -> None:
        scheduler = self._scheduler()
        now = time.monotonic()
        if scheduler is not None and scheduler.has_pending_requests():
            self._idle_since = None
            self._schedule_poke(0)
            raise DontCloseSpider
        if self._idle_since is None:
            self._idle_since = now
            if self.timeout > 0:
                logger.info("Shared queue empty; closing in %.0f s unless new requests arrive", self.timeout)
        if now - self._idle_since < self.timeout:
            self._schedule_poke(self.poll)
            raise DontCloseSpider
        # Let the engine close the spider with reason "finished".

    def spider_closed(self) -> None:
        if self._poke is not None and self._poke.active():
            self._poke.cancel()

    def _scheduler(self) -> Any:
        return engine.scheduler(self.crawler)

    def _schedule_poke(self, delay: float) -> None:
        # Wake the engine's request loop sooner than its 5 s heartbeat. Private attribute:
        # if a future Scrapy renames it we fall back to the heartbeat, only slower.
        from twisted.internet import reactor

        nextcall = engine.request_loop(self.crawler)
        if nextcall is None or (self._poke is not None and self._poke.active()):
            return
        self._poke = reactor.callLater(delay, nextcall.schedule)
