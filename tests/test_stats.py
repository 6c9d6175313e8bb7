"""The project's stats collector: Scrapy's in-memory one, without the per-call shim."""

from __future__ import annotations

import warnings

from scrapy.crawler import Crawler
from scrapy.spiders import Spider
from scrapy.utils.misc import load_object
from scrapy.utils.project import get_project_settings
from scrapy.utils.test import get_crawler

from scraper.runtime.stats import StatsCollector


def _crawler() -> Crawler:
    """A crawler counting with the collector the project's settings name."""
    crawler = get_crawler(Spider)
    crawler.stats = load_object(get_project_settings()["STATS_CLASS"])(crawler)
    return crawler


def test_the_project_counts_with_it_and_it_counts_as_scrapys_does() -> None:
    crawler = _crawler()
    stats = crawler.stats
    assert type(stats) is StatsCollector
    # No Python code runs on attribute reads (Scrapy's __getattribute__ shim ran on each).
    assert type(stats).__getattribute__ is object.__getattribute__
    stats.inc_value("pages")
    stats.inc_value("pages", 2)
    stats.inc_value("bytes", 10, start=100)
    stats.max_value("peak", 3)
    stats.max_value("peak", 1)
    stats.min_value("least", 3)
    stats.min_value("least", 1)
    stats.set_value("state", "on")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # Code written for older Scrapy passes the spider: still accepted.
        stats.inc_value("pages", spider=None)
    assert stats.get_stats() == {"pages": 4, "bytes": 110, "peak": 3, "least": 1, "state": "on"}
    assert stats.get_value("missing", "default") == "default"


def test_closing_keeps_the_last_runs_stats_per_spider() -> None:
    crawler = _crawler()
    crawler.spider = Spider("shop")
    crawler.stats.inc_value("item_scraped_count", 7)
    crawler.stats.close_spider(reason="finished")
    assert crawler.stats.spider_stats["shop"] == {"item_scraped_count": 7}
    crawler.stats.clear_stats()
    assert crawler.stats.get_stats() == {}
