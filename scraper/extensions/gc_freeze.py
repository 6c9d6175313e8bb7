"""Keep the garbage collector off what a crawl loads once, and out of every page's way.

By the time the engine starts, the process holds tens of thousands of long-lived objects that
no page ever frees: Scrapy's and Twisted's, and ours (CLDR currency tables, dateparser's
language data, price-parser's, the prepared SQL, the metrics registry). Each full collection
walked all of them again, about every thousand pages, for nothing: measured on the demo shop,
about 0.2 ms of CPU per page more than plain Scrapy spent in the collector. ``gc.freeze()``
moves them out of the collector's sight (CPython's own advice for such processes); what the
crawl allocates afterwards is collected as before, so a page's garbage is freed as usual.

A page allocates a few thousand objects (requests, responses, selectors, Deferreds, items),
nearly all freed by reference counting. With CPython's young-generation threshold of 700 the
collector ran about every third page of the demo shop's crawl: 1,460 collections and 0.51 s
for 3,475 pages (~8 s on the reactor thread). With 20,000 (``GC_YOUNG_THRESHOLD``) it ran 15
times for 0.21 s. The price is cyclic garbage waiting longer to be freed. Every page used to be
such garbage (its response and cached selector held each other, see
:mod:`scraper.middlewares.item_origin`): a 100,000-product crawl grew +21.5 % in RSS after its
first 10k pages (196 to 249 MB) at this threshold, +4.6 % at CPython's; with the cycle broken,
+2.4 % (143 to 150 MB).

``GC_FREEZE`` (true) turns both off; ``GC_YOUNG_THRESHOLD=0`` keeps CPython's threshold. The
stats ``gc/frozen``, ``gc/collections`` (of any generation, while the engine ran) and
``gc/collected`` (objects only the collector could free, i.e. cyclic garbage) show it. A page
should leave next to none: each page's response and its cached selector used to (see
:mod:`scraper.middlewares.item_origin`), and a spider that keeps a page in a cycle shows here.
"""

from __future__ import annotations

import gc
from typing import Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

from ..config import get_bool, get_int


class GcFreeze:
    def __init__(self, crawler: Any, young: int) -> None:
        self.crawler = crawler
        self.young = young
        self._collections = 0
        self._collected = 0

    @classmethod
    def from_crawler(cls, crawler: Any) -> GcFreeze:
        if not get_bool(crawler.settings, "GC_FREEZE", True):
            raise NotConfigured
        ext = cls(crawler, get_int(crawler.settings, "GC_YOUNG_THRESHOLD", 20_000, minimum=0))
        crawler.signals.connect(ext.engine_started, signal=signals.engine_started)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    @staticmethod
    def _count(what: str = "collections") -> int:
        return sum(generation[what] for generation in gc.get_stats())

    def engine_started(self) -> None:
        # Garbage start-up just left is freed first, or it would be kept for the whole crawl:
        # the young generations hold it. A full pass walked every start-up object again (~55 ms
        # of CPU per crawl, a fifth of the whole pipeline's fixed cost over plain Scrapy's) to
        # free some 20 objects more on the demo shop.
        gc.collect(1)
        gc.freeze()
        if self.young:
            _, middle, old = gc.get_threshold()
            gc.set_threshold(self.young, middle, old)
        self._collections = self._count()
        self._collected = self._count("collected")
        self.crawler.stats.set_value("gc/frozen", gc.get_freeze_count())

    def spider_closed(self) -> None:
        # What is still waiting for a collection counts too: gc/collected is then the crawl's
        # cyclic garbage, whatever the threshold (one full pass, once).
        gc.collect()
        self.crawler.stats.set_value("gc/collections", self._count() - self._collections)
        self.crawler.stats.set_value("gc/collected", self._count("collected") - self._collected)
