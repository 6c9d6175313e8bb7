"""Redis dropping the crawl's connections mid-crawl: reconnect with backoff, no crash, no loss."""

from __future__ import annotations

import time

from conftest import crawl_env
from scraper.demo_site import Catalog, DemoSite
from test_metrics import start_crawl


def test_crawl_survives_its_redis_connections_being_killed(clean) -> None:
    catalog = Catalog(products=80)
    with DemoSite(catalog, delay_ms=80) as site:
        env = crawl_env(clean, DEMO_SITE_URL=site.url, CONCURRENT_REQUESTS_PER_DOMAIN="2")
        crawl = start_crawl(env)
        admin = clean.redis()
        killed = 0
        deadline = time.monotonic() + 60
        while crawl.proc.poll() is None and time.monotonic() < deadline and killed < 40:
            for client in admin.client_list():
                if client.get("name", "").endswith(f":{crawl.proc.pid}"):
                    admin.client_kill_filter(_id=client["id"])
                    killed += 1
            time.sleep(0.15)
        _out, log = crawl.communicate(timeout=120)
    assert killed >= 10, "the crawl ended before its connections could be killed"
    assert crawl.returncode == 0, log[-3000:]
    assert "Traceback" not in log, log[-5000:]
    assert "Spider closed (finished)" in log
    stored = {r[0] for r in clean.query("SELECT sku FROM products")}
    assert stored == {p.sku for p in catalog.valid_products()}
    pages = [p for p, n in site.stats()["requests"].items() if p != "/robots.txt"]
    assert sorted(pages) == sorted(catalog.pages())
