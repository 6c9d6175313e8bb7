"""The add-on that prepares every crawl: validate our settings, then resolve the backends.

Add-ons run before any component is built and before settings are frozen, for every way a crawl
starts (``scrapy crawl``, scrapyd, a script with ``CrawlerProcess``), which makes this the one
place where a bad setting can fail early and by name. It is also where a process that is not a
crawl node (``scrapy shell``, ``fetch``, ``parse``, ``check``…) is kept off the shared state: see
:mod:`scraper.shared_state`.
"""

from __future__ import annotations

import logging
from typing import Any

from scrapy.settings import BaseSettings

from . import backends, shared_state
from .archive.config import read_config as read_archive_config
from .cleaning.numbers import check_locale as clean_locale
from .config import check_declared
from .middlewares.fetch_boundary import allowed_networks
from .politeness.limits import read_policy
from .processing.config import read_config as read_processing_config
from .quality.guard import check_mode as guard_mode
from .quality.settings import read_settings as quality_settings
from .queue.dupefilter import seen_config
from .queue.shards import shards_setting
from .queue.signing import check as secret_required
from .rendering.config import read_config as read_render_config

logger = logging.getLogger(__name__)

API_MIDDLEWARE = "scraper.scraping_api.middleware.ScrapingApiMiddleware"


def validate(settings: BaseSettings) -> None:
    """Raise :class:`~scraper.config.ConfigError` for the first malformed setting."""
    check_declared(settings)  # every declared number, switch and choice: type, bounds, choices
    seen_config(settings)  # DUPEFILTER_BACKEND, _EXPIRY, _BLOOM_*: choice, ranges, filter size
    shards_setting(settings)  # SCHEDULER_SHARDS: 1 to MAX_SHARDS
    read_policy(settings)  # POLITENESS_OVERRIDES' syntax, and the POLITENESS_* numbers
    read_archive_config(settings)  # ARCHIVE_*
    read_processing_config(settings)  # PROCESSING_*
    read_render_config(settings)  # RENDER_*
    quality_settings(settings)  # QUALITY_*: thresholds and switches
    guard_mode(settings)  # QUALITY_ON_BREAK
    clean_locale(settings)  # CLEAN_LOCALE: a locale CLDR knows
    allowed_networks(settings.get("FETCH_ALLOW_NETWORKS", ""))  # CIDRs
    secret_required(settings)  # SCHEDULER_SECRET: set with a shared Redis, no change-me anywhere


class BackendsAddon:
    @classmethod
    def from_crawler(cls, crawler: Any) -> BackendsAddon:
        return cls()

    def update_settings(self, settings: BaseSettings) -> None:
        validate(settings)
        if shared_state.is_crawl_node(settings):
            backends.apply(settings)
        else:
            # A developer command: no shared component is built, so no backend is needed.
            shared_state.use_local_state(settings)
        _fetch_directly_without_key(settings)


def _fetch_directly_without_key(settings: BaseSettings) -> None:
    # Without a key the middleware would disable itself with a WARNING, on every run of the
    # default setup; fetching directly is then the plan, said once at INFO.
    if str(settings.get("SCRAPING_API_KEY") or "").strip():
        return
    middlewares = settings["DOWNLOADER_MIDDLEWARES"]
    if middlewares.get(API_MIDDLEWARE) is not None:
        middlewares.set(API_MIDDLEWARE, None, priority=shared_state.PRIORITY)
        logger.info("No scraping API key (SCRAPING_API_KEY): fetching directly")
