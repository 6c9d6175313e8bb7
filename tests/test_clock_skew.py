"""One clock for the fleet: a worker whose clock runs 300 s ahead (Debian's faketime, installed
by `make tools`) crawls alongside a normal one without stealing its leases or fetching a page
twice, and says at start that its clock is off."""

from __future__ import annotations

import shutil

from support.crawls import crawl_env
from support.processes import start_crawl, wait_for
from support.stats import stat

from scraper.demo_site import Catalog, DemoSite


def test_a_worker_with_a_skewed_clock_steals_no_lease(clean) -> None:
    faketime = shutil.which("faketime")
    assert faketime, "faketime is missing: `make tools` installs it"
    # Long enough (about 7 s of pages) that the skewed worker joins the run on a loaded machine,
    # where starting it takes seconds: one that arrives after the run finished begins a new one.
    catalog = Catalog(products=120)
    with DemoSite(catalog, delay_ms=100) as site:
        env = crawl_env(
            clean,
            DEMO_SITE_URL=site.url,
            CONCURRENT_REQUESTS="2",
            SCHEDULER_IDLE_TIMEOUT="3",
            SCHEDULER_LEASE_TIMEOUT="20",
        )
        normal = start_crawl(env)
        wait_for(lambda: site.stats()["total"] > 5, timeout=60, step=0.05)
        # The monotonic clock stays true: only the wall clock (what leases used to be judged by) is off.
        skewed = start_crawl(
            {
                **env,
                "FAKETIME": "+300s",
                "DONT_FAKE_MONOTONIC": "1",
                "LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
            }
        )
        logs = [crawl.communicate(timeout=180)[1] for crawl in (normal, skewed)]
        counts = site.stats()["requests"]
    for crawl, log in zip((normal, skewed), logs):
        assert crawl.returncode == 0, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
    assert "This host's clock is 300 s ahead of Redis'" in logs[1], logs[1][-3000:]
    assert stat(logs[1], "response_received_count") > 0, logs[1][-3000:]  # it did take part
    # No page fetched twice, no lease put back by either worker.
    twice = {path: n for path, n in counts.items() if n > 1 and path != "/robots.txt"}
    assert not twice, twice
    assert sorted(p for p in counts if p != "/robots.txt") == sorted(catalog.pages())
    for log in logs:
        assert stat(log, "scheduler/redelivered") == 0, log[-3000:]
