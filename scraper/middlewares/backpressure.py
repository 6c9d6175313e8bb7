"""Hold new downloads while the Postgres writer is behind (``POSTGRES_MAX_PENDING``).

Each stored item waits for its commit, so a slow or absent database already slows the crawl;
but Scrapy keeps downloading up to its concurrency while responses wait for their items, and
those pages and rows pile up in memory for as long as the database is away. This middleware
stops new downloads once too many rows wait and lets them go when the writer has caught up:
memory stays bounded, the crawl pauses, and the requests it holds keep their leases (renewed,
not acknowledged) until their items are committed. If the writer gives up on the database, the
requests held here go back to the shared queue.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from scrapy import Request
from scrapy.exceptions import IgnoreRequest
from scrapy.utils.defer import maybe_deferred_to_future

from ..storage.owner import PostgresStore, store_of
from .requeue import requeue

logger = logging.getLogger(__name__)


class StoreBackpressureMiddleware:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self._holding = 0
        # Looked up once: every request asks it.
        self.store: PostgresStore | None = store_of(crawler)

    @classmethod
    def from_crawler(cls, crawler: Any) -> StoreBackpressureMiddleware:
        return cls(crawler)

    async def process_request(self, request: Request) -> None:
        # Only a crawl that stores items has a writer (the store pipeline creates it).
        writer = self.store.writer if self.store is not None else None
        if writer is None or not writer.over_limit():
            return None
        stats = self.crawler.stats
        if not self._holding:
            logger.warning(
                "Postgres is behind (%d rows waiting): holding new downloads until it catches up", writer.pending()
            )
        self._holding += 1
        stats.inc_value("postgres/backpressure_waits")
        started = time.monotonic()
        try:
            while writer.over_limit():
                await maybe_deferred_to_future(writer.wait_for_room())
        finally:
            self._holding -= 1
            stats.inc_value("postgres/backpressure_seconds", time.monotonic() - started)
        if writer.gave_up is not None:
            # The crawl is stopping (see the store pipeline): keep the page for the next run.
            requeue(self.crawler, request, "postgres/requeued")
            raise IgnoreRequest("Postgres unavailable: put back in the queue")
        if not self._holding:
            logger.info("Postgres caught up (%d rows waiting): downloading again", writer.pending())
        return None
