"""At-least-once delivery: a worker SIGKILLed mid-crawl loses nothing, and no row is doubled."""

from __future__ import annotations

import re
import signal

from conftest import crawl_env
from scraper.demo_site import Catalog, DemoSite
from test_metrics import start_crawl, wait_for


def test_a_killed_workers_requests_are_redelivered(clean) -> None:
    catalog = Catalog(products=120)
    with DemoSite(catalog, delay_ms=100) as site:
        # A short lease, so that the killed worker's requests come back within seconds.
        env = crawl_env(clean, DEMO_SITE_URL=site.url, CONCURRENT_REQUESTS="6", CONCURRENT_REQUESTS_PER_DOMAIN="3",
                        SCHEDULER_LEASE_TIMEOUT="3", SCHEDULER_IDLE_TIMEOUT="5")
        workers = [start_crawl(env) for _ in range(3)]
        wait_for(lambda: site.stats()["total"] > 50, timeout=60)
        victim = workers[0]
        leased = clean.redis().zcard("demo:lease_deadlines")
        victim.proc.send_signal(signal.SIGKILL)  # no cleanup of any kind: its leases just stop
        logs = [w.communicate(timeout=180)[1] for w in workers]
        counts = site.stats()["requests"]
    assert victim.returncode == -signal.SIGKILL
    for log in logs[1:]:
        assert "Spider closed (finished)" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
    assert leased > 0, "the kill came when no request was leased"

    # Every page was fetched; a page is fetched twice only if the killed worker held it.
    pages = {p: n for p, n in counts.items() if p != "/robots.txt"}
    assert sorted(pages) == sorted(catalog.pages())
    assert max(pages.values()) <= 2
    # Every extra fetch is a redelivery of a request the killed worker held (downloading, in a
    # callback, or with items not yet committed), and only those were redelivered.
    reaped = sum(int(n) for log in logs for n in re.findall(r"leases: (\d+) back in the queue", log))
    assert 0 < reaped <= leased
    assert sum(pages.values()) - len(pages) <= reaped
    # Outcome of every product: exactly one of stored row, reject, dead letter. None lost.
    rows = clean.query("SELECT sku, count(*) FROM products GROUP BY sku")
    assert all(n == 1 for _, n in rows)
    assert {sku for sku, _ in rows} == {p.sku for p in catalog.valid_products()}
    rejected = clean.query("SELECT count(DISTINCT url) FROM rejects")[0][0]
    assert rejected == len(catalog.broken_products())
    assert clean.redis().llen("demo:dead") == 0
    assert clean.redis().zcard("demo:lease_deadlines") == 0 and clean.redis().hlen("demo:leased") == 0
