"""One receiver for every component of ours that watches each stored item or each response.

Scrapy sends ``item_scraped`` through ``send_catch_log_async``, which makes each receiver an
asyncio task of its own: ~8 µs per item and receiver. The metrics (time from yield to commit)
and the data-quality counts (coverage, prices) both watch every item; connected through here,
they cost one task between them. ``response_received`` is sent synchronously, but PyDispatcher
looks up and inspects each receiver's signature on every page: the metrics, the data-quality
counts, the crawl summary and the clean pipeline (each page's language) share one receiver too.
An observer that raises is logged as Scrapy logs a receiver that raises, and the other
observers still see the item or the response.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from scrapy import signals

logger = logging.getLogger(__name__)


class _Fanout:
    def __init__(self) -> None:
        self.observers: list[Callable[..., None]] = []

    def item_scraped(self, item: Any) -> None:
        for observer in self.observers:
            try:
                observer(item)
            except Exception:
                logger.error("Error caught on signal handler: %r", observer, exc_info=True)

    def response_received(self, response: Any, request: Any) -> None:
        for observer in self.observers:
            try:
                observer(response, request)
            except Exception:
                logger.error("Error caught on signal handler: %r", observer, exc_info=True)


def on_item_scraped(crawler: Any, observer: Callable[[Any], None]) -> None:
    """Call ``observer(item)`` for each item that went through every pipeline."""
    fanout = crawler.__dict__.get("_item_observers")
    if fanout is None:
        fanout = crawler._item_observers = _Fanout()
        crawler.signals.connect(fanout.item_scraped, signal=signals.item_scraped, weak=False)
    fanout.observers.append(observer)


def on_response_received(crawler: Any, observer: Callable[[Any, Any], None]) -> None:
    """Call ``observer(response, request)`` for each response the engine receives."""
    fanout = crawler.__dict__.get("_response_observers")
    if fanout is None:
        fanout = crawler._response_observers = _Fanout()
        crawler.signals.connect(fanout.response_received, signal=signals.response_received, weak=False)
    fanout.observers.append(observer)
