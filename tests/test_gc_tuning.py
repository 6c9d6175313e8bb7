"""The collector leaves start-up's objects alone and runs seldom while a crawl runs."""

from __future__ import annotations

import re

from conftest import crawl


def _gc_stats(result) -> tuple[int, int, int]:
    def stat(name: str) -> int:
        found = re.search(rf"'{re.escape(name)}': (\d+)", result.stderr)
        assert found, f"no {name} in the final stats: {result.stderr[-2000:]}"
        return int(found.group(1))

    return stat("gc/frozen"), stat("gc/collections"), stat("response_received_count")


def test_collector_tuned_by_default_and_on_request(clean, site) -> None:
    frozen, collections, pages = _gc_stats(crawl(clean, site))
    assert frozen > 10_000  # Scrapy, Twisted and our own start-up objects
    cpython = _gc_stats(crawl(clean, site, GC_YOUNG_THRESHOLD="0", RUNS_FRESH="true"))[1]
    assert pages > 120
    # CPython's threshold of 700 collects every few pages; 20,000 a handful of times per crawl.
    assert collections * 5 < cpython, (collections, cpython)
