"""The crawl's metrics, read at scrape time from Scrapy's stats and the shared queue.

Counters are derived from ``crawler.stats`` rather than counted a second time, so what
Prometheus shows always equals Scrapy's own stats. Gauges that live elsewhere (queue depth and
age, seen-set size, rows waiting for the database) are read when Prometheus asks. Histograms
(latency, pipeline time) are observed as responses and items pass, see :mod:`.exporter`.

Names follow Prometheus conventions: ``scraper_`` prefix, ``_total`` counters, units in the
name, low-cardinality labels (spider, status class, error kind, outcome, field name).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

from ..storage.owner import existing_writer

logger = logging.getLogger(__name__)


def _counter(name: str, doc: str, labels: list[str], values: dict[tuple[str, ...], float]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for label_values, value in sorted(values.items()):
        family.add_metric(list(label_values), value)
    return family


def _gauge(name: str, doc: str, spider: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["spider"])
    family.add_metric([spider], value)
    return family


class CrawlCollector(Collector):
    def __init__(self, crawler: Any, queue_info: Callable[[], dict[str, float]]) -> None:
        self.crawler = crawler
        self.queue_info = queue_info
        self.spider_open = False
        self.last_response = 0.0

    def _processing_bound(self) -> float:
        from ..processing.config import read_config

        config = read_config(self.crawler.settings)
        return float(config.max_pending) if config.decoupled else 0.0

    @property
    def spider(self) -> str:
        spider = getattr(self.crawler, "spider", None)
        return getattr(spider, "name", None) or self.crawler.spidercls.name

    def collect(self) -> Iterator[Any]:
        stats = dict(self.crawler.stats.get_stats())
        s = self.spider
        get = lambda key: float(stats.get(key, 0) or 0)  # noqa: E731

        yield _counter(
            "scraper_requests", "Requests sent to the downloader.", ["spider"], {(s,): get("downloader/request_count")}
        )
        by_class: dict[tuple[str, ...], float] = defaultdict(float)
        errors: dict[tuple[str, ...], float] = defaultdict(float)
        rejected: dict[tuple[str, ...], float] = {}
        dead: dict[tuple[str, ...], float] = {}
        rates: dict[tuple[str, ...], float] = {}
        for key, value in stats.items():
            if key.startswith("downloader/response_status_count/"):
                by_class[(s, key.rsplit("/", 1)[1][:1] + "xx")] += value
            elif key.startswith("downloader/exception_type_count/"):
                errors[(s, key.rsplit(".", 1)[-1].rsplit("/", 1)[-1])] += value
            elif key.startswith("spider_exceptions/") and key != "spider_exceptions/count":
                errors[(s, key.rsplit("/", 1)[1])] += value
            elif key.startswith("item_rejected_reasons/"):
                rejected[(s, key.split("/", 1)[1])] = value
            elif key.startswith("dead_letters/") and key not in ("dead_letters/count", "dead_letters/callback_retries"):
                dead[(s, key.split("/", 1)[1])] = value
            elif key.startswith("politeness/rate/"):
                rates[(s, key[len("politeness/rate/") :])] = value
        yield _counter(
            "scraper_responses", "Responses received, by status class.", ["spider", "status_class"], dict(by_class)
        )
        yield _counter(
            "scraper_errors", "Download and callback errors, by exception.", ["spider", "kind"], dict(errors)
        )
        yield _counter(
            "scraper_api_credits", "Scraping-API credits spent.", ["spider"], {(s,): get("scraping_api/credits")}
        )
        yield _gauge(
            "scraper_api_budget_credits",
            "The run's scraping-API budget, shared by the fleet (0: none).",
            s,
            float(self.crawler.settings.getfloat("SCRAPING_API_BUDGET", 0) or 0),
        )
        yield _gauge(
            "scraper_api_run_spent_credits",
            "What every worker of the current run has spent of the scraping-API budget, as last seen.",
            s,
            get("scraping_api/run_spent"),
        )
        yield _counter(
            "scraper_rendered_pages", "Pages rendered in this node's browser.", ["spider"], {(s,): get("render/pages")}
        )
        yield _counter(
            "scraper_render_refused",
            "Requests of rendered pages the fetch boundary refused, by reason.",
            ["spider", "reason"],
            {(s, key.rsplit("/", 1)[1]): value for key, value in stats.items() if key.startswith("render/refused/")},
        )
        yield _counter(
            "scraper_browser_crashes",
            "Times this node's browser died or stopped answering (it is started again, its pages rendered again).",
            ["spider"],
            {(s,): get("render/browser_crashes")},
        )

        queue = self.queue_info()
        yield _gauge("scraper_queue_depth", "Requests waiting in the shared queue.", s, queue.get("depth", 0))
        yield _gauge(
            "scraper_queue_oldest_age_seconds", "Age of the oldest queued request.", s, queue.get("oldest_age", 0)
        )
        yield _gauge(
            "scraper_processing_pending_responses",
            "Fetched responses in the stream not yet processed (PROCESSING=decoupled).",
            s,
            queue.get("responses", 0),
        )
        yield _gauge(
            "scraper_processing_max_pending_responses",
            "Responses in the stream at which fetchers "
            "stop fetching (PROCESSING_MAX_PENDING; 0 unless PROCESSING=decoupled).",
            s,
            self._processing_bound(),
        )
        yield _gauge(
            "scraper_dupefilter_size",
            "Fingerprints in the shared seen-set (estimated for a Bloom filter).",
            s,
            queue.get("seen", 0),
        )
        yield _counter(
            "scraper_queue_enqueued",
            "Requests this process added to the shared queue.",
            ["spider"],
            {(s,): get("scheduler/enqueued/redis")},
        )
        yield _counter(
            "scraper_queue_dequeued",
            "Requests this process took from the shared queue.",
            ["spider"],
            {(s,): get("scheduler/dequeued/redis")},
        )
        yield _counter(
            "scraper_queue_redelivered",
            "Requests of dead workers this process put back in the queue.",
            ["spider"],
            {(s,): get("scheduler/redelivered")},
        )
        yield _counter(
            "scraper_dead_letters", "Requests set aside as dead letters, by reason.", ["spider", "reason"], dead
        )
        yield _counter(
            "scraper_redis_write_refusals",
            "Writes Redis refused (OOM, READONLY, MISCONF); the crawl waits them out.",
            ["spider"],
            {(s,): get("redis/write_refusals")},
        )
        yield _gauge(
            "scraper_quality_guard_broken",
            "1 once the live quality guard found a field's coverage "
            "broken in this process' run (QUALITY_ON_BREAK says what follows).",
            s,
            get("quality/break"),
        )
        yield _counter(
            "scraper_quality_held_items",
            "Items held by the live quality guard (not stored; see scrapy runs SPIDER --report RUN).",
            ["spider"],
            {(s,): get("quality/held_items")},
        )
        rate = GaugeMetricFamily(
            "scraper_politeness_rate",
            "The fleet's adaptive rate (requests/s) of each site that throttled it, as this process last read it.",
            labels=["spider", "domain"],
        )
        for labels, value in sorted(rates.items()):
            rate.add_metric(list(labels), value)
        yield rate
        yield _counter(
            "scraper_politeness_throttled",
            "Answers that throttled the fleet (429/503), each tried again at the site's lowered rate.",
            ["spider"],
            {(s,): get("politeness/throttle_answers")},
        )
        yield _counter(
            "scraper_politeness_wait_seconds",
            "Time requests waited for the fleet's per-site limits.",
            ["spider"],
            {(s,): get("politeness/wait_seconds")},
        )
        yield _counter(
            "scraper_revisit_pages",
            "Pages by what their visit found (changed, unchanged, new, not_modified: a 304) or what a revisit "
            "run did (skipped: a link to a page not due; seeded: a page due by its history).",
            ["spider", "outcome"],
            {
                (s, outcome): get(f"revisit/{outcome}")
                for outcome in ("changed", "unchanged", "new", "not_modified", "skipped", "seeded")
            },
        )

        yield _counter(
            "scraper_repairs",
            "Repairs of broken fields tried, by outcome (learnt: verified and recorded; refused: nothing "
            "could be verified, the field stays held).",
            ["spider", "outcome"],
            {(s, "learnt"): get("repair/learnt"), (s, "refused"): get("repair/refused")},
        )
        yield _counter(
            "scraper_repair_items",
            "Items whose field was read through a repair.",
            ["spider"],
            {(s,): sum(v for k, v in stats.items() if k.startswith("repair/applied/"))},
        )

        yield _counter("scraper_items_scraped", "Items the spider yielded.", ["spider"], {(s,): get("items/yielded")})
        duplicates, rejects = get("item_duplicates_dropped"), get("item_rejected_count")
        yield _counter(
            "scraper_items_dropped",
            "Items dropped, by reason.",
            ["spider", "reason"],
            {
                (s, "duplicate"): duplicates,
                (s, "rejected"): rejects,
                (s, "other"): max(0.0, get("item_dropped_count") - duplicates - rejects),
            },
        )
        yield _counter("scraper_items_rejected", "Items rejected, by failing field.", ["spider", "reason"], rejected)
        yield _counter(
            "scraper_items_stored",
            "Items committed to the database, by outcome.",
            ["spider", "outcome"],
            {(s, o): get(f"postgres/{o}") for o in ("inserted", "updated", "unchanged")},
        )

        yield _counter(
            "scraper_items_gone", "Rows a finished run did not see, marked gone.", ["spider"], {(s,): get("items/gone")}
        )
        yield _counter(
            "scraper_archive_records",
            "Responses archived, by WARC record type.",
            ["spider", "type"],
            {(s, "response"): get("archive/responses"), (s, "revisit"): get("archive/revisits")},
        )
        yield _counter(
            "scraper_archive_bytes",
            "Bytes written to the archive (gzipped WARC).",
            ["spider"],
            {(s,): get("archive/bytes")},
        )
        yield _counter(
            "scraper_archive_not_archived",
            "Pages not archived since the archive's storage failed (full disk, read-only folder, failing bucket).",
            ["spider"],
            {(s,): get("archive/not_archived")},
        )
        yield _counter(
            "scraper_storage_rows_written",
            "Rows written (items and rejects).",
            ["spider"],
            {(s,): get("postgres/rows_written")},
        )
        yield _counter(
            "scraper_storage_write_failures",
            "Batches the database failed to take.",
            ["spider"],
            {(s,): get("postgres/write_failures")},
        )
        flush = SummaryMetricFamily("scraper_storage_flush_seconds", "Time to write one batch.", labels=["spider"])
        flush.add_metric([s], count_value=get("postgres/batches"), sum_value=get("postgres/flush_seconds_total"))
        yield flush
        writer = existing_writer(self.crawler)
        yield _gauge(
            "scraper_storage_pending_rows",
            "Rows waiting to be written.",
            s,
            float(writer.pending()) if writer is not None else 0.0,
        )
        yield _gauge(
            "scraper_storage_max_pending_rows",
            "Rows waiting at which new downloads are held (POSTGRES_MAX_PENDING).",
            s,
            float(writer.max_pending) if writer is not None else 0.0,
        )

        yield _gauge("scraper_spider_open", "1 while the spider runs.", s, 1.0 if self.spider_open else 0.0)
        yield _gauge(
            "scraper_last_response_timestamp_seconds",
            "When the last response arrived (unix time).",
            s,
            self.last_response,
        )


def queue_reader(crawler: Any, server: Any) -> Callable[[], dict[str, float]]:
    """Read the shared queue's depth, age and seen-set size; cached for a second so that
    several Prometheus servers scraping at once cost Redis one read."""
    from ..queue.dupefilter import seen_size
    from ..queue.keys import responses_key
    from ..queue.queues import frontier

    cache: dict[str, Any] = {"at": 0.0, "value": {}}

    def read() -> dict[str, float]:
        if time.monotonic() - cache["at"] < 1.0:
            return cache["value"]
        spider = getattr(crawler, "spider", None)
        if spider is None:
            return {}
        try:
            queue = frontier(server, spider, crawler.settings)
            value = {
                "depth": float(len(queue)),
                "oldest_age": queue.oldest_age(),
                "seen": seen_size(server, spider.name, crawler.settings),
                "responses": float(server.xlen(responses_key(spider.name))),
            }
        except Exception as exc:  # a metrics scrape must never take the crawl down
            logger.warning("Could not read the shared queue for metrics: %s", exc)
            value = cache["value"]
        cache.update(at=time.monotonic(), value=value)
        return value

    return read
