"""Data quality in the metrics: the current run's field coverage, what it is expected to be,
and how the spider's last checked run came out.

Coverage is the whole run's (every node's last report summed, as in :mod:`scraper.runs.metrics`),
so each node exports the same values: aggregate with ``max``, not ``sum``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..queue import keys
from . import coverage, figures
from .monitor import QualityMonitor


class QualityCollector(Collector):
    def __init__(self, crawler: Any, server: Any) -> None:
        self.crawler = crawler
        self.server = server
        self._cached: tuple[float, dict[str, float]] = (0.0, {})

    def _current(self, spider: str) -> dict[str, float]:
        # Cached for a second: several Prometheus servers scraping at once cost Redis one read.
        at, value = self._cached
        if time.monotonic() - at < 1.0:
            return value
        run_id = int(self.server.hget(keys.run_key(spider), "id") or 0)
        value = figures.summed(self.server, spider, run_id) if run_id else {}
        self._cached = (time.monotonic(), value)
        return value

    def collect(self) -> Iterator[Any]:
        monitor = self.crawler.get_extension(QualityMonitor)
        spider = getattr(getattr(self.crawler, "spider", None), "name", None)
        if monitor is None or spider is None:
            return
        try:
            current = self._current(spider)
        except Exception:  # metrics must not fail a scrape because Redis blinked
            current = {}
        counts = coverage.item_counts(current)
        seen = coverage.fields_seen(current)
        expected = monitor.expected_coverage()
        ratio = GaugeMetricFamily(
            "scraper_field_coverage",
            "Share of the current run's stored items with the field filled, all nodes.",
            labels=["spider", "item_type", "field"],
        )
        items = GaugeMetricFamily(
            "scraper_field_coverage_items",
            "Stored items the current run's coverage is counted over, all nodes.",
            labels=["spider", "item_type"],
        )
        for item_type, count in sorted(counts.items()):
            items.add_metric([spider, item_type], count)
            fields = seen.get(item_type, set()) | {f for t, f in expected if t == item_type}
            for field in sorted(fields):
                value = current.get(f"{coverage.PREFIX}{item_type}/{field}", 0.0) / count
                ratio.add_metric([spider, item_type, field], value)
        yield ratio
        yield items
        wanted = GaugeMetricFamily(
            "scraper_field_coverage_expected",
            "The coverage the current run is expected "
            "to reach: declared, 1 for required fields, else the average of the last "
            "finished runs less QUALITY_COVERAGE_TOLERANCE.",
            labels=["spider", "item_type", "field"],
        )
        for (item_type, field), value in sorted(expected.items()):
            wanted.add_metric([spider, item_type, field], value)
        yield wanted
        baseline = monitor.baseline_items()
        if baseline is not None:
            family = GaugeMetricFamily(
                "scraper_quality_baseline_items",
                "Median items stored by the last finished runs the current run is compared with.",
                labels=["spider"],
            )
            family.add_metric([spider], baseline)
            yield family
        if monitor.last is not None:
            run_id, result, failed = monitor.last
            degraded = GaugeMetricFamily(
                "scraper_quality_last_run_degraded",
                "1 if the spider's last checked run failed a data-quality check.",
                labels=["spider", "run"],
            )
            degraded.add_metric([spider, str(run_id)], 1.0 if result == "degraded" else 0.0)
            yield degraded
            family = GaugeMetricFamily(
                "scraper_quality_last_run_failed_checks",
                "Data-quality checks the spider's last checked run failed.",
                labels=["spider"],
            )
            family.add_metric([spider], float(failed))
            yield family
