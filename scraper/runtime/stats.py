"""Scrapy's in-memory stats collector, without the cost of a deprecation shim on every call.

Scrapy 2.19's ``StatsCollector`` defines ``__getattribute__`` so that its methods warn when
passed the deprecated ``spider`` argument: every attribute read of the collector, its own
``self._stats`` included, runs Python code, and every method call goes through a wrapper that
inspects its arguments. A crawl makes a dozen stats calls per page (Scrapy's and ours): on the
demo shop that shim was ~2 % of the reactor thread's time. Methods still accept ``spider=``,
as Scrapy's do; they only no longer warn about it.
"""

from __future__ import annotations

from scrapy.statscollectors import MemoryStatsCollector


class StatsCollector(MemoryStatsCollector):
    __getattribute__ = object.__getattribute__  # type: ignore[assignment]
