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
from collections.abc import Callable
from typing import Any

from scrapy import signals

logger = logging.getLogger(__name__)


class _Fanout:
    def __init__(self) -> None:
        self.observers: list[Callable[..., None]] = []

    def _send(self, *args: Any) -> None:
        for observer in self.observers:
            try:
                observer(*args)
            except Exception:
                logger.error("Error caught on signal handler: %r", observer, exc_info=True)

    # Named parameters: PyDispatcher passes a receiver only the arguments its signature names.
    def item_scraped(self, item: Any) -> None:
        self._send(item)

    def response_received(self, response: Any, request: Any) -> None:
        self._send(response, request)


def _observe(crawler: Any, attribute: str, signal: Any, receiver: str, observer: Callable[..., None]) -> None:
    fanout = crawler.__dict__.get(attribute)
    if fanout is None:
        fanout = _Fanout()
        setattr(crawler, attribute, fanout)
        crawler.signals.connect(getattr(fanout, receiver), signal=signal, weak=False)
    fanout.observers.append(observer)


def on_item_scraped(crawler: Any, observer: Callable[[Any], None]) -> None:
    """Call ``observer(item)`` for each item that went through every pipeline."""
    _observe(crawler, "_item_observers", signals.item_scraped, "item_scraped", observer)


def on_response_received(crawler: Any, observer: Callable[[Any, Any], None]) -> None:
    """Call ``observer(response, request)`` for each response the engine receives."""
    _observe(crawler, "_response_observers", signals.response_received, "response_received", observer)
