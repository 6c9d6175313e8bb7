"""The spider middleware that learns where each field came from (:mod:`.provenance`) and counts it
per run in ``field_sources`` (:mod:`.field_sources`).

Next to the spider (after the dead-letter middleware, before the canonical one rewrites ``url``):
it sees each item exactly as the callback yielded it. The counts are kept in memory per (run,
item type, field, source), a few dozen keys per spider, and added to Postgres from a worker
thread every ``FLUSH_EVERY`` seconds and when the spider closes; only crawl nodes with a database
write them (``scrapy parse`` and ``shell`` items still get their ``_sources``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg2
from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import LoopingCall

from ..config import get_bool
from ..items.base import StoredItem
from ..runs_hook import current_run_id
from ..runtime.worker_threads import defer_to_thread
from ..shared_state import is_crawl_node
from . import field_sources
from .provenance import MISSING, PageRecorder, give_back, lend

logger = logging.getLogger(__name__)

FLUSH_EVERY = 5.0  # seconds between two writes of the counts


class ProvenanceMiddleware:
    def __init__(self, crawler: Any, dsn: str | None) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.dsn = dsn
        self.counts: Counter[field_sources.Key] = Counter()
        self.since: datetime | None = None
        self._ensured = False
        self._said_failure = False
        self._loop: LoopingCall | None = None

    @classmethod
    def from_crawler(cls, crawler: Any) -> ProvenanceMiddleware:
        settings = crawler.settings
        if not get_bool(settings, "PROVENANCE_ENABLED"):
            raise NotConfigured("PROVENANCE_ENABLED is off")
        counting = is_crawl_node(settings) and settings.get("DATABASE_URL")
        mw = cls(crawler, settings["DATABASE_URL"] if counting else None)
        if mw.dsn:
            crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
            crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        return mw

    # -- the callback's output ---------------------------------------------------------------------
    def process_spider_input(self, response: Any) -> None:
        lend(response)

    def _page(self, response: Any) -> PageRecorder:
        return PageRecorder(response, self._count if self.dsn else None)

    def process_spider_output(self, response: Any, result: Iterable[Any]) -> Iterator[Any]:
        try:
            yield from self._page(response).each(result)
        finally:
            give_back(response)

    async def process_spider_output_async(self, response: Any, result: AsyncIterator[Any]) -> AsyncIterator[Any]:
        try:
            async for obj in self._page(response).each_async(result):
                yield obj
        finally:
            give_back(response)

    def _count(self, item: StoredItem) -> None:
        run = current_run_id(self.crawler) or 0
        kind = type(item).__name__
        found = item._sources
        counts = self.counts
        for name in item._values:
            counts[(run, kind, name, found.get(name, MISSING))] += 1
        if self.since is None:
            self.since = datetime.now(UTC)

    def moved(self, item_type: str, field: str, old: str, new: str) -> None:
        """An item's field now comes from *new* (a repair read it again after it was counted)."""
        if self.dsn is None:
            return
        run = current_run_id(self.crawler) or 0
        self.counts[(run, item_type, field, old)] -= 1
        self.counts[(run, item_type, field, new)] += 1

    # -- the counts' writes ------------------------------------------------------------------------
    def spider_opened(self, spider: Any) -> None:
        self.spider_name = spider.name
        self._loop = LoopingCall(self._flush)
        self._loop.start(FLUSH_EVERY, now=False)

    async def spider_closed(self, spider: Any) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        await maybe_deferred_to_future(self._flush())

    def _flush(self) -> Deferred:
        if not self.counts:
            return succeed(None)
        counts, self.counts = self.counts, Counter()
        since, self.since = self.since or datetime.now(UTC), None
        return defer_to_thread(self._write, counts, since).addCallback(self._unsaved)

    def _unsaved(self, counts: Counter[field_sources.Key] | None) -> None:
        # On the reactor thread, where the counts are added to.
        if counts:
            self.counts.update(counts)

    def _write(self, counts: Counter[field_sources.Key], since: datetime) -> Counter[field_sources.Key] | None:
        """Add *counts* to the table; returns them when they could not be (kept for the next write)."""
        try:
            conn = psycopg2.connect(self.dsn, connect_timeout=10, application_name="field_sources")
            try:
                with conn, conn.cursor() as cur:
                    if not self._ensured:
                        field_sources.ensure(cur)
                    field_sources.save(cur, self.spider_name, counts, since, datetime.now(UTC))
                self._ensured = True
            finally:
                conn.close()
        except psycopg2.Error as exc:
            # Counts only: the items are stored all the same.
            self.stats.inc_value("provenance/not_saved")
            if not self._said_failure:
                self._said_failure = True
                logger.warning("Could not save the field sources (%s): tried again at the next write", exc)
            return counts
        self.stats.inc_value("provenance/saved_rows", len(counts))
        return None
