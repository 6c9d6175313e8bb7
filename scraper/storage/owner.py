"""The crawl's one Postgres writer, kept by an extension that components find with Scrapy's
``crawler.get_extension()``.

Made on first use by a component that stores (the validate and store pipelines, the quality
guard: :func:`writer_for`), connected and migrated then, and closed (drained) when the spider
closes. The components that only look at it (back-pressure, metrics, gone-marking, the
scheduler, the revisit recorder) read :attr:`PostgresStore.writer`, None until it is made: a
crawl that stores nothing never connects. Settings: ``POSTGRES_*``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from scrapy import signals

from ..config import ConfigError, get_float, get_int, mask_url
from . import history, retention
from .writer import PostgresWriter

logger = logging.getLogger(__name__)


class PostgresStore:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.writer: PostgresWriter | None = None

    @classmethod
    def from_crawler(cls, crawler: Any) -> PostgresStore:
        return cls(crawler)

    def open_writer(self) -> PostgresWriter:
        if self.writer is not None:
            return self.writer
        from ..items import stored_item_types

        settings = self.crawler.settings
        writer = PostgresWriter(
            settings["DATABASE_URL"],
            batch_size=get_int(settings, "POSTGRES_BATCH_SIZE", 1000, minimum=1),
            flush_interval=get_float(settings, "POSTGRES_FLUSH_INTERVAL", 1.0, minimum=0.01),
            last_seen_resolution=get_float(settings, "POSTGRES_LAST_SEEN_RESOLUTION", 3600.0, minimum=0),
            retry_timeout=get_float(settings, "POSTGRES_RETRY_TIMEOUT", 600.0, minimum=0),
            max_pending=get_int(settings, "POSTGRES_MAX_PENDING", 10_000, minimum=1),
            stall_warn=get_float(settings, "POSTGRES_STALL_WARN_SECONDS", 30.0, minimum=0),
            stats=self.crawler.stats,
            history_context=history_context_for(self.crawler),
        )
        writer.open(stored_item_types())
        logger.info("Storing items in %s", mask_url(settings["DATABASE_URL"]))
        keep = get_float(settings, "HISTORY_RETENTION_DAYS", 0.0, minimum=0)
        if keep > 0:
            prune_history(settings["DATABASE_URL"], keep)
        self.writer = writer
        # Connected now, after every extension's own handler: the writer closes (drained) last,
        # once the run's recorder, the quality monitor and the revisit recorder are done.
        self.crawler.signals.connect(self._close, signal=signals.spider_closed)
        return writer

    async def _close(self) -> None:
        if self.writer is not None:
            await self.writer.close()


def prune_history(database_url: str, keep_days: float) -> retention.PruneReport:
    """The months of history past *keep_days* dropped; ConfigError when the history table is
    not partitioned (nothing could be dropped in O(1))."""
    import psycopg2

    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            partitioned = retention.is_partitioned(cur)
        if not partitioned:
            raise ConfigError(
                "HISTORY_RETENTION_DAYS: item_changes was made before monthly partitions; run "
                "`scrapy migrate --partition-history` once (it converts the table in place)"
            )
        report = retention.prune(conn, keep_days)
    finally:
        conn.close()
    for line in report.lines():
        logger.info(line)
    return report


def store_of(crawler: Any) -> PostgresStore | None:
    """The crawl's store extension (None when a hand-made crawler leaves it out)."""
    try:
        return crawler.get_extension(PostgresStore)
    except RuntimeError:  # asked before the extensions exist: nothing made yet
        return None


def writer_for(crawler: Any) -> PostgresWriter:
    """The crawl's one writer, made on first use."""
    store = store_of(crawler)
    if store is None:
        raise RuntimeError("storing items needs the scraper.storage.owner.PostgresStore extension (EXTENSIONS)")
    return store.open_writer()


def existing_writer(crawler: Any) -> PostgresWriter | None:
    """The crawl's writer if a component has made it, else None."""
    store = store_of(crawler)
    return store.writer if store is not None else None


def history_context_for(crawler: Any) -> Callable[[], history.Context]:
    """Who the crawl's history entries name: its spider, its run, and why (a crawl, or a
    ``scrapy reprocess`` replay, which sets ``ARCHIVE_REPLAY``)."""
    from ..runs_hook import current_run_id

    replay = crawler.settings.getbool("ARCHIVE_REPLAY")

    def context() -> history.Context:
        spider = getattr(crawler, "spider", None)
        reason = "crawl"
        if replay:
            # A replay reading fields through a repair (scraper/repair/live.py) is that repair's work.
            reason = "repair" if crawler.stats.get_value("repair/applied_any") else "reprocess"
        return history.Context(getattr(spider, "name", None), current_run_id(crawler), reason)

    return context
