"""The relay's Prometheus metrics, on an endpoint of its own (``CHANGEFEED_METRICS_PORT``).

A relay is not a crawl process: it has its own registry and port, and says with
``scraper_changefeed_sink_up`` when its sink is away (the relay waits, nothing is lost), so an
alert can say it too.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class FeedMetrics:
    def __init__(self, sink: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.published = Counter(
            "scraper_changefeed_events_published", "Events the sink confirmed", ["sink"], registry=r
        ).labels(sink)
        self.dead = Counter(
            "scraper_changefeed_dead_letters", "Events the sink gave up on (dead letters)", ["sink"], registry=r
        ).labels(sink)
        self.retries = Counter(
            "scraper_changefeed_retries", "Batches sent again after the sink did not take them", ["sink"], registry=r
        ).labels(sink)
        self.sink_up = Gauge(
            "scraper_changefeed_sink_up",
            "1 while the sink takes events, 0 while the relay waits for it",
            ["sink"],
            registry=r,
        ).labels(sink)
        self.lag = Gauge(
            "scraper_changefeed_lag_seconds",
            "From the last published event's transaction start to its confirm",
            ["sink"],
            registry=r,
        ).labels(sink)
        self.last_publish = Gauge(
            "scraper_changefeed_last_publish_timestamp_seconds",
            "When the sink last confirmed a batch",
            ["sink"],
            registry=r,
        ).labels(sink)

    def serve(self, bind: str, port: int) -> Any:
        """Serve ``/metrics`` on *bind*:*port* (a thread); returns the server."""
        server, _thread = start_http_server(port, addr=bind, registry=self.registry)
        return server

    def delivered(self, published: int, dead: int, lag: float | None) -> None:
        self.published.inc(published)
        self.dead.inc(dead)
        if lag is not None:
            self.lag.set(lag)
        self.last_publish.set(time.time())
        self.sink_up.set(1)
