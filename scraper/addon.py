"""The add-on that prepares every crawl: validate our settings, then resolve the backends.

Add-ons run before any component is built and before settings are frozen, for every way a crawl
starts (``scrapy crawl``, scrapyd, a script with ``CrawlerProcess``), which makes this the one
place where a bad setting can fail early and by name.
"""

from __future__ import annotations

from typing import Any

from scrapy.settings import BaseSettings

from . import backends
from .config import get_bool, get_float, get_int
from .politeness.limits import read_policy
from .quality.settings import read_settings as quality_settings
from .queue.dupefilter import seen_config

# (setting, kind, minimum): checked at start so a typo fails by name, not deep in a component.
CHECKED_SETTINGS: tuple[tuple[str, str, float], ...] = (
    ("CONCURRENT_REQUESTS", "int", 1),
    ("CONCURRENT_REQUESTS_PER_DOMAIN", "int", 1),
    ("CONCURRENT_ITEMS", "int", 1),
    ("DOWNLOAD_DELAY", "float", 0),
    ("DOWNLOAD_TIMEOUT", "float", 0.001),
    ("DOWNLOAD_MAXSIZE", "int", 0),
    ("DOWNLOAD_WARNSIZE", "int", 0),
    ("SCHEDULER_IDLE_TIMEOUT", "float", 0),
    ("SCHEDULER_DUPEFILTER_LOCAL_CACHE", "int", 0),
    ("SCHEDULER_PREFETCH", "int", 1),
    ("SCHEDULER_LEASE_TIMEOUT", "float", 0),
    ("SCHEDULER_MAX_REDELIVERIES", "int", 0),
    ("SCHEDULER_IDLE_POLL", "float", 0.05),
    ("POSTGRES_BATCH_SIZE", "int", 1),
    ("POSTGRES_FLUSH_INTERVAL", "float", 0.01),
    ("POSTGRES_LAST_SEEN_RESOLUTION", "float", 0),
    ("POSTGRES_MAX_PENDING", "int", 1),
    ("POSTGRES_RETRY_TIMEOUT", "float", 0),
    ("METRICS_PORT", "int", 0),
    ("DLQ_CALLBACK_RETRIES", "int", 0),
    ("METRICS_PORT_RANGE", "int", 1),
    ("METRICS_LINGER", "float", 0),
    ("POLITENESS_RATE", "float", 0),
    ("POLITENESS_CONCURRENCY", "int", 0),
    ("POLITENESS_MAX_WAIT", "float", 1),
    ("RUNS_NODE_TTL", "float", 1),
    ("RUNS_REPORT_INTERVAL", "float", 0.1),
)


def validate(settings: BaseSettings) -> None:
    """Raise :class:`~scraper.config.ConfigError` for the first malformed setting."""
    for name, kind, minimum in CHECKED_SETTINGS:
        if settings.get(name) is None:
            continue
        if kind == "int":
            get_int(settings, name, 0, minimum=int(minimum))
        else:
            get_float(settings, name, 0.0, minimum=minimum)
    for name in ("SCHEDULER_FLUSH_ON_START", "METRICS_ENABLED", "METRICS_ANNOUNCE", "RUNS_FRESH"):
        if settings.get(name) is not None:
            get_bool(settings, name, False)
    seen_config(settings)  # DUPEFILTER_BACKEND, _EXPIRY, _BLOOM_*: choice, ranges, filter size
    read_policy(settings)  # POLITENESS_OVERRIDES' syntax, and the POLITENESS_* numbers
    quality_settings(settings)  # QUALITY_*: thresholds and switches


class BackendsAddon:
    @classmethod
    def from_crawler(cls, crawler: Any) -> "BackendsAddon":
        return cls()

    def update_settings(self, settings: BaseSettings) -> None:
        validate(settings)
        backends.apply(settings)
