"""The current run in the metrics: who it is as an info metric, its figures as gauges.

The run id is a label of ``scraper_run_info`` only, never of the other series, so a new run
does not start new series everywhere. The figures are the whole run's (every node's last
report summed), so each node exports the same values: aggregate them with ``max``, not ``sum``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..queue import keys
from . import record
from .state import summed_figures

_ITEMS = {
    "items_new": "new",
    "items_updated": "updated",
    "items_unchanged": "unchanged",
    "items_rejected": "rejected",
    "duplicates": "duplicate",
}


class RunCollector(Collector):
    def __init__(self, crawler: Any, server: Any) -> None:
        self.crawler = crawler
        self.server = server
        self._cached: tuple[float, dict[str, Any]] = (0.0, {})

    def _read(self) -> dict[str, Any]:
        # Cached for a second: several Prometheus servers scraping at once cost Redis one read.
        at, value = self._cached
        if time.monotonic() - at < 1.0:
            return value
        spider = getattr(self.crawler, "spider", None)
        run = {}
        if spider is not None:
            run = {k.decode(): v.decode() for k, v in self.server.hgetall(keys.run_key(spider.name)).items()}
            if run.get("id"):
                run["figures"], run["nodes"] = summed_figures(self.server, spider.name, int(run["id"]))
        self._cached = (time.monotonic(), run)
        return run

    def collect(self) -> Iterator[Any]:
        spider = getattr(getattr(self.crawler, "spider", None), "name", None)
        if spider is None:
            return
        try:
            run = self._read()
        except Exception:  # metrics must not fail a scrape because Redis blinked
            return
        if not run.get("id"):
            return
        info = GaugeMetricFamily("scraper_run_info", "The spider's current run (1).", labels=["spider", "run", "state"])
        info.add_metric([spider, run["id"], run.get("state", "running")], 1.0)
        yield info
        figures = run["figures"]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["spider"])
            family.add_metric([spider], value)
            return family

        yield gauge(
            "scraper_run_started_timestamp_seconds",
            "When the current run started (unix time).",
            float(run.get("started") or 0),
        )
        yield gauge("scraper_run_nodes", "Nodes that took part in the current run.", float(run["nodes"]))
        yield gauge(
            "scraper_run_pages",
            "Pages fetched in the current run, all nodes.",
            figures.get(record.FIGURES["pages"], 0.0),
        )
        items = GaugeMetricFamily(
            "scraper_run_items", "Items of the current run, all nodes, by outcome.", labels=["spider", "outcome"]
        )
        for column, outcome in _ITEMS.items():
            items.add_metric([spider, outcome], figures.get(record.FIGURES[column], 0.0))
        yield items
        for column, doc in (
            ("dead_letters", "Dead letters"),
            ("api_credits", "Scraping-API credits spent"),
            ("redeliveries", "Requests of stopped workers redelivered"),
            ("throttled", "Pages a site throttled (429/503), tried again at a lower rate"),
            ("not_archived", "Pages not archived (the archive's storage failed)"),
        ):
            yield gauge(
                f"scraper_run_{column}",
                f"{doc} in the current run, all nodes.",
                figures.get(record.FIGURES[column], 0.0),
            )
