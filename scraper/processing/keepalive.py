"""A fetcher stays open while the stream holds responses (``PROCESSING=decoupled``).

Processors put the links they find into the shared queue; until the stream is empty, an empty
queue does not mean the crawl is done. So a fetcher does not close while the stream holds an
entry (waiting, or in a processor's hands), and with it the run is not finished: the run's
"queue empty, nothing leased, no node left" then also means every fetched page was processed.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from scrapy import signals
from scrapy.exceptions import DontCloseSpider, NotConfigured

from ..adapters import engine
from ..backends.redis_client import UNREACHABLE, get_redis
from ..config import get_float
from .config import read_config
from .stream import ResponseStream

logger = logging.getLogger(__name__)


class StreamKeepAlive:
    def __init__(self, crawler: Any, stream: ResponseStream, poll: float) -> None:
        self.crawler = crawler
        self.stream = stream
        self.poll = poll
        self._poke: Any = None
        self._last_report = float("-inf")

    @classmethod
    def from_crawler(cls, crawler: Any) -> StreamKeepAlive:
        if not read_config(crawler.settings).fetcher:
            raise NotConfigured
        stream = ResponseStream(get_redis(crawler.settings["REDIS_URL"]), crawler.spidercls.name)
        poll = get_float(crawler.settings, "SCHEDULER_IDLE_POLL", 0.5, minimum=0.05)
        ext = cls(crawler, stream, min(poll, 0.25))
        crawler.signals.connect(ext.spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    def spider_idle(self) -> None:
        try:
            waiting = len(self.stream)
        except UNREACHABLE:
            waiting = 1  # unknown: not finished because Redis is away
        if not waiting:
            return
        now = time.monotonic()
        if now - self._last_report >= 10:
            self._last_report = now
            logger.info(
                "Shared queue empty, %d responses wait for processors (`scrapy process %s`): not closing yet",
                waiting,
                self.crawler.spider.name,
            )
        self._schedule_poke()
        raise DontCloseSpider

    def spider_closed(self) -> None:
        if self._poke is not None and self._poke.active():
            self._poke.cancel()

    def _schedule_poke(self) -> None:
        # The processors' new links reach the queue while the engine idles: look again soon,
        # not at Scrapy's 5 s heartbeat.
        from twisted.internet import reactor

        nextcall = engine.request_loop(self.crawler)
        if nextcall is None or (self._poke is not None and self._poke.active()):
            return
        self._poke = reactor.callLater(self.poll, nextcall.schedule)
