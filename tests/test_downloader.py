"""The HTTP download handler keeps finished connections for the next request to the same host."""

from __future__ import annotations

from support.crawls import crawl

from scraper.demo_site import DemoSite


def _connections(services, catalog, **settings: str) -> tuple[int, int]:
    with DemoSite(catalog) as site:
        crawl(services, site, CONCURRENT_REQUESTS="8", CONCURRENT_REQUESTS_PER_DOMAIN="4", **settings)
        return site.stats()["total"], site.connections_opened()


def test_a_crawl_reuses_its_connections(clean, catalog) -> None:
    pages, opened = _connections(clean, catalog)
    assert pages > 120
    assert opened <= 2 * 4, f"{opened} connections for {pages} pages"


def test_scrapys_own_pool_limit_churns_connections(clean, catalog) -> None:
    # Pages served at once and many per slot: the downloader starts the next request before the
    # finished connection is back in the pool, so a pool of one idle connection per concurrent
    # request (Scrapy's) is one over when it comes back, and closes one.
    pages, opened = _connections(clean, catalog, DOWNLOAD_POOL_PER_HOST="4")
    assert opened > 2 * 4 * 2, f"{opened} connections for {pages} pages"
