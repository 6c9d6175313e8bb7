"""One replayed page through the spider middlewares, its callback and the item pipelines: what
Scrapy's scraper does with a response, at less cost per page.

Scrapy's scraper hands each response's output to ``CONCURRENT_ITEMS`` worker tasks through a
queue, made anew for every response: 16 tasks and as many queue end-markers per page, though a
product page yields one item. Here the same calls run in the same order (``scrape_response_async``
with the scraper's ``call_spider_async``, its ``handle_spider_error`` for a failing callback,
``engine.crawl`` for a request, ``start_itemproc_async`` for an item, at most
``CONCURRENT_ITEMS`` of one page's items in the pipelines at once) with one task per item.
The page counts in the scraper's slot as Scrapy's own do, so the engine's back-out and its idle
and closing checks see it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from scrapy import Request
from scrapy.core.scraper import Slot
from scrapy.http import Response
from scrapy.utils.defer import aiter_errback, iter_errback
from twisted.python.failure import Failure

logger = logging.getLogger(__name__)


async def scrape(crawler: Any, response: Response, request: Request) -> None:
    """*response* to its callback, and what the callback yields on to the engine or the pipelines."""
    scraper = crawler.engine.scraper
    slot = scraper.slot
    slot.active.add(request)
    slot.active_size += max(len(response.body), Slot.MIN_RESPONSE_SIZE)
    try:
        try:
            output = await scraper.spidermw.scrape_response_async(scraper.call_spider_async, response, request)
        except Exception:
            scraper.handle_spider_error(Failure(), request, response)
        else:
            await _outputs(crawler, output, request, response)
    except Exception:
        logger.error("Scraper bug processing %(request)s", {"request": request}, exc_info=True)
    finally:
        slot.finish_response(response, request)
        scraper._check_if_closing()


async def _outputs(crawler: Any, output: Any, request: Request, response: Response) -> None:
    scraper = crawler.engine.scraper
    limit = max(1, scraper.concurrent_items)
    running: set[asyncio.Task] = set()
    loop = asyncio.get_running_loop()
    if isinstance(output, AsyncIterator):
        items: Any = aiter_errback(output, scraper.handle_spider_error, request, response)
    else:
        items = _as_async(iter_errback(output, scraper.handle_spider_error, request, response))
    async for item in items:
        if isinstance(item, Request):
            crawler.engine.crawl(request=item)
            continue
        if item is None:
            continue
        while len(running) >= limit:
            await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        task = loop.create_task(scraper.start_itemproc_async(item, response=response))
        running.add(task)
        task.add_done_callback(running.discard)
    if running:
        await asyncio.wait(running)


async def _as_async(iterable: Any) -> AsyncIterator[Any]:
    for item in iterable:
        yield item
