"""The archived pages handed to the spider straight from the archive, past the engine's
scheduler and downloader.

A replay fetches nothing, so what Scrapy's engine does per request between the start requests and
the spider (the scheduler's queue, the downloader's slots and concurrency, the engine's loop
waking per request, a thread hop per record read) is cost with no purpose. Here each record, read
in batches (:mod:`.reader`) a batch ahead in a worker thread, becomes its request and goes
through the crawl's downloader middlewares (the replay's answers it, then every
``process_response`` as in the engine path), the engine's ``response_received`` signal, and the
engine's own scraper: the spider middlewares, the callback and the item pipelines, with the same
signals and stats. What is stored is what the engine path stores. A middleware that answers with
a request (a meta refresh) hands it to the engine, as the engine path does.

As many pages are in the scraper at once as the engine lets in (``SCRAPER_SLOT_MAX_ACTIVE_SIZE``:
their items wait for their batch's commit).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from scrapy import Request, signals
from scrapy.http import Response
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.log import failure_to_exc_info, logformatter_adapter
from twisted.python.failure import Failure

from ..runtime.worker_threads import defer_to_thread
from .reader import load_batch, parse_record
from .scrape import scrape

logger = logging.getLogger(__name__)

BATCH = 256  # records read per batch (and read ahead)
LOADED_META = "_archive_loaded"  # the record's (status, headers, body), or why it cannot be read


class DirectReplay:
    def __init__(self, crawler: Any, records: list[Any], make_request: Callable[[Any], Request]) -> None:
        self.crawler = crawler
        self.records = records
        self.make_request = make_request
        self._scraping = 0  # pages handed to the scraper and not done yet
        self._done: asyncio.Future | None = None

    async def run(self) -> None:
        """Every record through the spider; returns once each is scraped, so that the engine,
        seeing its start requests done, finds the spider idle and closes it."""
        store = self.crawler.replay_store
        batches = [self.records[i : i + BATCH] for i in range(0, len(self.records), BATCH)]
        ahead = defer_to_thread(load_batch, store, batches[0], parse_record) if batches else None
        for n, batch in enumerate(batches):
            loaded = await maybe_deferred_to_future(ahead)
            ahead = defer_to_thread(load_batch, store, batches[n + 1], parse_record) if n + 1 < len(batches) else None
            for record, outcome in zip(batch, loaded, strict=True):
                if not await self._room_in_scraper():
                    break  # the spider is closing (CloseSpider, a shutdown): no more pages
                await self._one(record, outcome)
            else:
                continue
            break
        while self._scraping:
            self._done = asyncio.get_running_loop().create_future()
            await self._done

    def _closing(self) -> bool:
        engine = self.crawler.engine
        return not engine.running or engine.spider is None or engine.scraper.slot.closing is not None

    async def _room_in_scraper(self) -> bool:
        """Waits until the scraper takes another page (the engine's own back-out: no more pages
        in it than it allows); False once the spider is closing."""
        slot = self.crawler.engine.scraper.slot
        while slot.needs_backout() and not self._closing():
            await asyncio.sleep(0.005)
        # One pass of the loop per page: the pages already in make progress as this one goes in.
        await asyncio.sleep(0)
        return not self._closing()

    async def _one(self, record: Any, outcome: Any) -> None:
        engine = self.crawler.engine
        request = self.make_request(record)
        request.meta[LOADED_META] = outcome
        middleware = engine.downloader.middleware
        try:
            result = await middleware.download_async(_unreachable, request)
        except Exception:
            # As the engine path: the failure goes to the request's errback, if any.
            self._scrape(Failure(), request)
            return
        if isinstance(result, Request):
            engine.crawl(result)
            return
        if result.request is None:
            result.request = request
        logkws = self.crawler.logformatter.crawled(result.request, result, engine.spider)
        if logkws is not None:
            logger.log(*logformatter_adapter(logkws), extra={"spider": engine.spider})
        self.crawler.signals.send_catch_log(
            signal=signals.response_received, response=result, request=result.request, spider=engine.spider
        )
        self._scraping += 1
        task = asyncio.get_running_loop().create_task(scrape(self.crawler, result, request))
        task.add_done_callback(self._scraped)

    def _scrape(self, result: Failure, request: Request) -> None:
        # A page that could not be read: to the request's errback through Scrapy's scraper, as the
        # engine path hands it (rare enough that its cost does not matter).
        self._scraping += 1
        d = self.crawler.engine.scraper.enqueue_scrape(result, request)
        d.addErrback(
            lambda f: logger.info(
                "Error while handling downloader output", exc_info=failure_to_exc_info(f), extra={"spider": None}
            )
        )
        d.addBoth(self._scraped)

    def _scraped(self, _: Any) -> None:
        self._scraping -= 1
        if not self._scraping and self._done is not None and not self._done.done():
            self._done.set_result(None)


async def _unreachable(request: Request) -> Response:
    # The replay's downloader middleware answers every request before a download would start.
    raise RuntimeError(f"replay: {request.url} reached the download handler")
