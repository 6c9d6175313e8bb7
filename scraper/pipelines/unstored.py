"""Items the database could not take: their page becomes a dead letter.

A batch can fail for good without the database refusing a row (that goes to ``rejects``): a
deadlock that outlasts its retries, or Postgres staying away past ``POSTGRES_RETRY_TIMEOUT``, when
the writer fails every waiting row at once (:class:`~scraper.storage.writer.DatabaseUnavailable`).
Those items are gone from this process, but the page each came from is kept: it goes to the dead
letters once, with the reason (``store: …``), so ``scrapy dlq requeue <spider> --reason store``
fetches it again. When the database is gone the spider also closes with
``postgres_unavailable``, since every further page would only end up there too; requests still in
the shared queue stay for the next run.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from scrapy.exceptions import DropItem
from scrapy.utils.defer import deferred_from_coro

from ..middlewares.dead_letters import bury

logger = logging.getLogger(__name__)

CLOSE_REASON = "postgres_unavailable"


class _Unstored:
    """Per crawl: the pages already set aside, and whether the crawl is already stopping."""

    def __init__(self) -> None:
        self.buried: weakref.WeakSet[Any] = weakref.WeakSet()
        self.stopping = False


# Kept here, by crawler, rather than on the crawler: no component reads another's private state.
_CRAWLS: weakref.WeakKeyDictionary[Any, _Unstored] = weakref.WeakKeyDictionary()


def set_aside(crawler: Any, item: Any, error: Exception, stop: bool = True) -> DropItem:
    """Dead-letter *item*'s page (once per page) and, with *stop*, stop the crawl; returns the
    DropItem to raise."""
    crawler.stats.inc_value("postgres/items_not_stored")
    request = getattr(item, "_request", None)
    unstored = _CRAWLS.get(crawler)
    if unstored is None:
        unstored = _CRAWLS[crawler] = _Unstored()
    buried = unstored.buried
    if request is not None and request not in buried:
        buried.add(request)
        bury(crawler, request, f"store: {error}", 1)
    elif request is None:
        logger.error("An item that could not be stored has no page to dead-letter: %r", item)
    engine = crawler.engine
    if stop and not unstored.stopping:
        unstored.stopping = True
        logger.error(
            "Stopping the crawl: %s. Its pages are dead letters (requeue them with "
            "`scrapy dlq requeue %s --reason store`); the queue is kept.",
            error,
            crawler.spider.name,
        )
        deferred_from_coro(engine.close_spider_async(reason=CLOSE_REASON)).addErrback(
            lambda f: logger.error("Could not close the spider: %s", f.getErrorMessage())
        )
    return DropItem(f"Not stored ({error})", log_level="ERROR")
