"""The environment of a crawl through the local scraping-API stand-in."""

from __future__ import annotations

from typing import Any

from .crawls import crawl_env

#: The stand-in's key in the tests: a canary that must never show in a log, a stat or a row.
KEY = "canary-7f3c9e1d4b2a8e6f0c5d"


def api_env(services: Any, site_url: str, api: Any, key: str = KEY, **extra: str) -> dict[str, str]:
    """A crawl of the demo shop at *site_url* through *api* (a StandIn; None: direct)."""
    env = crawl_env(services, DEMO_SITE_URL=site_url)
    env.update(
        METRICS_ENABLED="false",
        SCRAPING_API_RETRY_BACKOFF="0.05",
        SCRAPING_API_POLL_INTERVAL="0.05",
    )
    if api is not None:
        env.update(SCRAPING_API_KEY=key, SCRAPING_API_URL=api.url)
    env.update(extra)
    return env
