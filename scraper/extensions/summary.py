"""A short summary of the crawl, logged (and printed by ``make demo``) when the spider closes.

A crawl that fetched nothing, or whose start requests were dropped, also gets a warning naming
the cause (offsite, robots.txt, already seen in this run, refused by the fetch boundary,
unreachable) and the setting or flag that changes it: those reasons otherwise live only in the
stats, under a summary that says "0 pages … 0 errors".

The pages/s rate is over the time the crawl was fetching (until its last response), not the
idle wait for other nodes' work before a finished crawl closes.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from scrapy import Request, signals

from ..item_observers import on_response_received
from ..runs.cost import cost

logger = logging.getLogger(__name__)

ACTIVE_STAT = "summary/active_seconds"
_IGNORED = "scrapy.exceptions.IgnoreRequest"


def summarize(stats: dict[str, Any], elapsed: float) -> str:
    pages = stats.get("response_received_count", 0)
    stored = stats.get("item_scraped_count", 0)
    active = stats.get(ACTIVE_STAT) or elapsed
    return (
        f"{pages} pages, {stored} items stored "
        f"({stats.get('postgres/inserted', 0)} new, {stats.get('postgres/updated', 0)} updated, "
        f"{stats.get('postgres/unchanged', 0)} unchanged), "
        f"{stats.get('item_rejected_count', 0)} rejected, "
        f"{stats.get('item_duplicates_dropped', 0)} duplicates dropped, "
        f"{stats.get('items/gone', 0)} gone, "
        f"{stats.get('log_count/ERROR', 0)} errors, in {elapsed:.1f} s "
        f"({pages / active if active else 0:.0f} pages/s)"
    )


def politeness_line(stats: dict[str, Any]) -> str | None:
    """Throttled pages, time spent waiting for turns and the rates reached per site, if any."""
    throttled = stats.get("politeness/throttled_pages", 0)
    rates = sorted((k[len("politeness/rate/") :], v) for k, v in stats.items() if k.startswith("politeness/rate/"))
    delays = sorted(
        (k[len("politeness/crawl_delay/") :], v) for k, v in stats.items() if k.startswith("politeness/crawl_delay/")
    )
    if not throttled and not rates and not delays:
        return None
    parts = [
        f"{throttled} pages throttled (429/503) and tried again "
        f"({stats.get('politeness/throttled_retries', 0)} retries, "
        f"{stats.get('dead_letters/throttled', 0)} given up as dead letters)",
        f"{stats.get('politeness/wait_seconds', 0):.1f} s waited for turns",
    ]
    for domain, rate in rates[:5]:
        low = stats.get(f"politeness/rate_min/{domain}", rate)
        parts.append(f"{domain} at {rate:g} requests/s (lowest {low:g})")
    for domain, delay in delays[:5]:
        parts.append(f"{domain} asks Crawl-delay {delay:g} s")
    return "; ".join(parts)


def causes(stats: dict[str, Any], spider: Any = None) -> list[str]:
    """Why requests went unfetched, each with what changes it, from the crawl's stats."""
    found = []
    offsite = stats.get("offsite/filtered", 0)
    if offsite:
        domains = getattr(spider, "allowed_domains", None)
        found.append(
            f"{offsite} offsite (not in the spider's allowed_domains {domains!r}: list host names, "
            "without scheme or port)"
        )
    robots = stats.get("robotstxt/forbidden", 0)
    if robots:
        found.append(f"{robots} forbidden by robots.txt (-s ROBOTSTXT_OBEY=False to ignore it)")
    seen = stats.get("dupefilter/filtered", 0) + stats.get("dupefilter/filtered_shared", 0)
    if seen:
        name = getattr(spider, "name", "<spider>")
        settings = getattr(spider, "settings", None)
        expiry = settings.getfloat("DUPEFILTER_EXPIRY", 0) if settings is not None else 0
        if expiry:
            found.append(
                f"{seen} already seen within DUPEFILTER_EXPIRY={expiry:g}s (the seen-set outlives runs; "
                "lower it, or -s SCHEDULER_FLUSH_ON_START=true to forget every page)"
            )
        else:
            found.append(
                f"{seen} already seen in this run (the seen-set of a run that has not finished; "
                f"`scrapy crawl {name} --fresh` discards that run)"
            )
    refused = stats.get("fetch_boundary/forbidden_address", 0)
    if refused:
        found.append(
            f"{refused} requests refused by the fetch boundary (a loopback, private or link-local "
            "address, which a crawl node does not fetch unless FETCH_ALLOW_NETWORKS allows its network: "
            "FETCH_ALLOW_NETWORKS=127.0.0.0/8 for a site on this machine)"
        )
    scheme = stats.get("fetch_boundary/forbidden_scheme", 0)
    if scheme:
        found.append(f"{scheme} requests refused by the fetch boundary (not http or https)")
    outside = stats.get("fetch_boundary/offsite", 0)
    if outside:
        domains = getattr(spider, "allowed_domains", None)
        found.append(
            f"{outside} requests refused by the fetch boundary (not in the spider's allowed_domains {domains!r})"
        )
    # A request a downloader middleware ignores (the boundary, offsite, robots.txt: each said
    # above) is counted as a download exception too, though nothing was downloaded.
    ignored = stats.get(f"downloader/exception_type_count/{_IGNORED}", 0)
    failed = stats.get("downloader/exception_count", 0) - ignored
    if failed > 0:
        kinds = sorted(
            (
                key.rsplit("/", 1)[-1].rsplit(".", 1)[-1]
                for key in stats
                if key.startswith("downloader/exception_type_count/") and not key.endswith(_IGNORED)
            ),
        )
        found.append(
            f"{failed} downloads failed, unreachable ({', '.join(kinds)}; check the start URL, "
            "DOWNLOAD_TIMEOUT and RETRY_TIMES)"
        )
    unexplained = ignored - refused - scheme - outside - offsite - robots
    if unexplained > 0:
        found.append(f"{unexplained} requests ignored by a downloader middleware (its warning in the log says why)")
    return found


class CrawlSummary:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.started = time.monotonic()
        self.last_response: float | None = None
        self.start_dropped = 0

    @classmethod
    def from_crawler(cls, crawler: Any) -> CrawlSummary:
        ext = cls(crawler)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        on_response_received(crawler, ext.response_received)
        crawler.signals.connect(ext.request_dropped, signal=signals.request_dropped)
        return ext

    def spider_opened(self) -> None:
        self.started = time.monotonic()

    def response_received(self, response: Any, request: Any) -> None:
        self.last_response = time.monotonic()

    def request_dropped(self, request: Request) -> None:
        if request.meta.get("is_start_request"):
            self.start_dropped += 1

    def spider_closed(self, reason: str) -> None:
        now = time.monotonic()
        stats = self.crawler.stats
        if self.last_response is not None:
            stats.set_value(ACTIVE_STAT, round(self.last_response - self.started, 3))
        values = stats.get_stats()
        run = f", run {values['run/id']} of {self.crawler.spider.name}" if values.get("run/id") else ""
        logger.info("Crawl summary (%s%s): %s", reason, run, summarize(values, now - self.started))
        spent = cost(
            values.get("postgres/inserted", 0),
            values.get("postgres/updated", 0),
            values.get("response_received_count", 0),
            values.get("scraping_api/credits", 0),
        )
        if spent.changes:
            logger.info(
                "Cost: %d changes captured, %.1f pages%s per change",
                spent.changes,
                spent.pages_per_change,
                "" if spent.credits_per_change is None else f" and {spent.credits_per_change:.1f} API credits",
            )
        revisit = revisit_line(values)
        if revisit:
            logger.info("Revisits: %s", revisit)
        repaired = repair_line(values)
        if repaired:
            logger.info("Repairs: %s", repaired)
        polite = politeness_line(values)
        if polite:
            logger.info("Politeness: %s", polite)
        if values.get("processing/handed_off"):
            logger.info(
                "PROCESSING=decoupled: %d responses handed to the stream; their items are stored by "
                "`scrapy process %s` and counted in the run's figures (`scrapy runs`). The run finishes "
                "once the stream is empty too",
                values["processing/handed_off"],
                self.crawler.spider.name,
            )
        if values.get("processing/entries") is not None or self.crawler.settings.getbool("PROCESSING_PROCESSOR"):
            return  # a processor fetches nothing: no page fetched is no fault of its spider
        # robots.txt answers count as responses; they are not the pages the crawl is for.
        pages = values.get("response_received_count", 0) - values.get("robotstxt/response_count", 0)
        if pages and not self.start_dropped:
            return
        spider = self.crawler.spider
        why = causes(values, spider)
        if not pages:
            what = "No page was fetched"
        else:
            what = f"{self.start_dropped} start request(s) were dropped"
        if not why:
            why = ["the spider yielded no request (check its start_urls or start())"]
        logger.warning("%s for %r: %s", what, getattr(spider, "name", "?"), "; ".join(why))


def repair_line(values: dict[str, Any]) -> str:
    """What repairs did in this process (see :mod:`scraper.repair.live`); empty when nothing."""
    parts = []
    if values.get("repair/learnt"):
        parts.append(f"{values['repair/learnt']} learnt (`scrapy repairs SPIDER` lists them)")
    if values.get("repair/refused"):
        parts.append(f"{values['repair/refused']} tries refused (nothing verified: the field stays held)")
    for key in sorted(values):
        if key.startswith("repair/applied/"):
            unread = values.get(f"repair/unread/{key[len('repair/applied/') :]}", 0)
            parts.append(
                f"{key[len('repair/applied/') :]} read through a repair in {values[key]} item(s)"
                + (f", {unread} page(s) it does not read" if unread else "")
            )
    return "; ".join(parts)


def revisit_line(values: dict[str, Any]) -> str:
    """What the page states saved: 304s, links to pages not due, due pages queued (see
    :mod:`scraper.revisit`); empty when none of it happened."""
    parts = []
    if values.get("revisit/not_modified"):
        parts.append(
            f"{values['revisit/not_modified']} of {values.get('revisit/conditional', 0)} conditional requests not modified"
        )
    if values.get("revisit/seeded"):
        parts.append(f"{values['revisit/seeded']} pages due by their history queued")
    if values.get("revisit/skipped"):
        parts.append(f"{values['revisit/skipped']} links to pages not due skipped")
    for stat, what in (("revisit/changed", "changed"), ("revisit/unchanged", "unchanged"), ("revisit/new", "new")):
        if values.get(stat):
            parts.append(f"{values[stat]} pages {what}")
    return "; ".join(parts)
