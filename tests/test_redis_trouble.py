"""Redis dropping the crawl's connections, or restarting, mid-crawl: reconnect with backoff, no crash,
no loss."""

from __future__ import annotations

import time
from pathlib import Path

import redis
from support.crawls import assert_each_product_stored_or_rejected_once, crawl_env
from support.processes import start_crawl, wait_for
from support.servers import StoppableRedis

from scraper.demo_site import Catalog, DemoSite


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


def test_crawl_waits_out_a_redis_restart(clean, tmp_path: Path) -> None:
    server = StoppableRedis(tmp_path)
    server.start()
    catalog = Catalog(products=120)
    try:
        with DemoSite(catalog, delay_ms=50) as site:
            env = crawl_env(
                clean,
                REDIS_URL=server.url,
                DEMO_SITE_URL=site.url,
                CONCURRENT_REQUESTS="4",
                SCHEDULER_IDLE_TIMEOUT="3",
                SCHEDULER_LEASE_TIMEOUT="5",
            )
            crawl = start_crawl(env)
            wait_for(lambda: site.stats()["total"] > 40, timeout=60, step=0.05)
            server.stop()
            down_at = site.stats()["total"]
            time.sleep(15)  # longer than the client's own retries (about 6 s), and than the lease timeout
            server.start()
            _out, log = crawl.communicate(timeout=180)
            counts = site.stats()["requests"]
        assert crawl.returncode == 0, log[-3000:]
        assert "Traceback" not in log, log[-5000:]
        assert "Spider closed (finished)" in log
        assert "Redis unreachable" in log
        assert down_at < len(catalog.pages())  # Redis went away mid-crawl
        assert sorted(p for p in counts if p != "/robots.txt") == sorted(catalog.pages())
        assert_each_product_stored_or_rejected_once(clean.query, catalog)
        after = redis.Redis.from_url(server.url)
        assert after.zcard("{demo}:lease_deadlines") == 0 and after.llen("{demo}:dead") == 0
    finally:
        server.stop()
