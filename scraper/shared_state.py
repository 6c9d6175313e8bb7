"""Crawl nodes and developer commands: who may touch the fleet's shared state.

A crawl node (``scrapy crawl``, a scrapyd job, ``scrapy demo``) takes work from the shared
Redis queue, claims links in the seen-set and items in the dedupe hash, books politeness slots,
registers itself as a node, announces its metrics endpoint and writes to Postgres.

Every other command (``shell``, ``fetch``, ``view``, ``parse``, ``check``, ``runspider``,
``bench``, a script with ``CrawlerProcess``) is a developer's look at a site. It must never join
a live crawl: pointed at production Redis, ``scrapy check`` would otherwise take a request from
the queue, crawl the site and clear the crawl's seen-set when it finishes. Those commands get
Scrapy's own in-memory scheduler and dupefilter, keep every downloader and spider middleware
that shapes what a page looks like (the scraping API included), and drop the components that
read or write shared state. Items are cleaned and checked against their schema, never stored.

Setting: ``SHARED_STATE`` (true for ``crawl`` and ``demo``, false otherwise). ``-s
SHARED_STATE=true`` makes any command a full crawl node, for debugging the shared queue itself.
"""

from __future__ import annotations

from scrapy.settings import BaseSettings

from .config import get_bool

SETTING = "SHARED_STATE"

# Scrapy's own, kept in memory by the process that runs them.
LOCAL_SCHEDULER = "scrapy.core.scheduler.Scheduler"
LOCAL_DUPEFILTER = "scrapy.dupefilters.RFPDupeFilter"

# Components that read or write Redis, Postgres or the metrics target folder, per setting.
SHARED_COMPONENTS: dict[str, tuple[str, ...]] = {
    "ITEM_PIPELINES": (
        "scraper.pipelines.validate.ValidatePipeline",
        "scraper.pipelines.dedupe.DedupePipeline",
        "scraper.pipelines.store.StorePipeline",
    ),
    "DOWNLOADER_MIDDLEWARES": (
        "scraper.politeness.middleware.PolitenessMiddleware",
        "scraper.middlewares.dead_letters.DeadLetterDownloaderMiddleware",
        "scraper.middlewares.backpressure.StoreBackpressureMiddleware",
        "scraper.processing.handoff.HandoffMiddleware",
        "scraper.processing.backpressure.StreamBackpressureMiddleware",
    ),
    "SPIDER_MIDDLEWARES": ("scraper.middlewares.dead_letters.DeadLetterSpiderMiddleware",),
    "EXTENSIONS": (
        "scraper.extensions.idle_close.IdleClose",
        "scraper.monitoring.exporter.MetricsExporter",
        "scraper.extensions.progress.ProgressLog",
        "scraper.extensions.summary.CrawlSummary",
        "scraper.processing.keepalive.StreamKeepAlive",
    ),
}

# What takes the place of the removed components in a developer command.
LOCAL_COMPONENTS: dict[str, dict[str, int]] = {
    # Validation without the rejects table: reasons are logged, nothing is written.
    "ITEM_PIPELINES": {"scraper.pipelines.preview.PreviewPipeline": 200},
    # ProgressLog replaced it for crawl nodes; it reads the shared queue.
    "EXTENSIONS": {"scrapy.extensions.logstats.LogStats": 0},
}

# Above the spider's custom_settings: a spider cannot put shared components back by accident.
PRIORITY = "cmdline"


def is_crawl_node(settings: BaseSettings) -> bool:
    """True when this process may use the shared queue, seen-set, dedupe claims and database."""
    return get_bool(settings, SETTING, False)


def use_local_state(settings: BaseSettings) -> None:
    """Rewrite *settings* (not yet frozen) so that the crawl touches no shared state."""
    settings.set("SCHEDULER", LOCAL_SCHEDULER, priority=PRIORITY)
    settings.set("DUPEFILTER_CLASS", _local_dupefilter(settings), priority=PRIORITY)
    for name, paths in SHARED_COMPONENTS.items():
        components = settings[name]
        for path in paths:
            components.set(path, None, priority=PRIORITY)
        for path, order in LOCAL_COMPONENTS.get(name, {}).items():
            components.set(path, order, priority=PRIORITY)


def _local_dupefilter(settings: BaseSettings) -> str:
    # ``scrapy shell`` asks for no dupefilter at all; keep any dupefilter that is not ours.
    current = settings.get("DUPEFILTER_CLASS")
    if isinstance(current, str) and not current.startswith("scraper."):
        return current
    return LOCAL_DUPEFILTER
