"""Prepare a crawl that may use the scraping API, before anything is logged.

Scrapy logs every overridden setting, with its value, right after the add-ons ran; the key is
registered for redaction here so that line (and every later one) shows ``***``. The
``SCRAPING_API_*`` settings are checked here too, so a bad value fails at start, by name.
"""

from __future__ import annotations

from typing import Any

from scrapy.settings import BaseSettings

from ..runtime.secrets import install_log_redaction, register_secret
from .middleware import get_settings


class ScrapingApiAddon:
    @classmethod
    def from_crawler(cls, crawler: Any) -> ScrapingApiAddon:
        return cls()

    def update_settings(self, settings: BaseSettings) -> None:
        key = str(settings.get("SCRAPING_API_KEY") or "").strip()
        if key:
            install_log_redaction()
            register_secret(key)
            get_settings(settings)
