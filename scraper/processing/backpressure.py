"""A fetcher holds new downloads while the stream holds ``PROCESSING_MAX_PENDING`` responses.

Processors that are slow, stopped or waiting for the database would otherwise let fetchers fill
Redis with pages. New downloads wait here (their leases renewed, not acknowledged) until the
processors have caught up; what the stream holds at most is the limit plus the downloads
already under way (``CONCURRENT_REQUESTS`` per fetcher). Like the Postgres writer's backpressure
(:mod:`scraper.middlewares.backpressure`), the first of the downloader middlewares to act.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from scrapy import Request
from scrapy.exceptions import NotConfigured
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import reactor, task

from ..backends.redis_client import UNREACHABLE, get_redis
from .config import read_config
from .stream import ResponseStream

logger = logging.getLogger(__name__)

# One XLEN round trip per this many seconds at most, however many requests ask meanwhile.
_LOOK_EVERY = 0.05
_WAIT_STEP = 0.2


class StreamBackpressureMiddleware:
    def __init__(self, crawler: Any, stream: ResponseStream, limit: int) -> None:
        self.crawler = crawler
        self.stream = stream
        self.limit = limit
        self._length = 0
        self._looked_at = float("-inf")
        self._holding = 0
        self.look_every = _LOOK_EVERY

    @classmethod
    def from_crawler(cls, crawler: Any) -> StreamBackpressureMiddleware:
        config = read_config(crawler.settings)
        if not config.fetcher:
            raise NotConfigured
        stream = ResponseStream(get_redis(crawler.settings["REDIS_URL"]), crawler.spidercls.name)
        return cls(crawler, stream, config.max_pending)

    def length(self) -> int:
        now = time.monotonic()
        if now - self._looked_at >= self.look_every:
            try:
                self._length = len(self.stream)
            except UNREACHABLE:
                pass  # the handoff finds out and says so; the last length stands
            self._looked_at = now
        return self._length

    def over_limit(self) -> bool:
        return self.length() >= self.limit

    def _running(self) -> bool:
        try:
            return bool(self.crawler.engine.running)
        except RuntimeError:  # no engine yet: nothing is stopping
            return True

    async def process_request(self, request: Request) -> None:
        if request.callback is NO_CALLBACK:
            return None
        if not self.over_limit():
            # Counted now, so that the requests let through before the next look cannot,
            # together, overshoot the limit by more than those already downloading.
            self._length += 1
            return None
        stats = self.crawler.stats
        if not self._holding:
            logger.warning(
                "The stream holds %d responses (PROCESSING_MAX_PENDING=%d): holding new downloads "
                "until the processors catch up",
                self._length,
                self.limit,
            )
        self._holding += 1
        stats.inc_value("processing/backpressure_waits")
        started = time.monotonic()
        try:
            # A stopping crawl lets them go: its close waits for every download under way.
            while self.over_limit() and self._running():
                await maybe_deferred_to_future(task.deferLater(reactor, _WAIT_STEP, lambda: None))
            self._length += 1
        finally:
            self._holding -= 1
            stats.inc_value("processing/backpressure_seconds", time.monotonic() - started)
        if not self._holding:
            logger.info("The processors caught up (%d responses in the stream): downloading again", self._length)
        return None
