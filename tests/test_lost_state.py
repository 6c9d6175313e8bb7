"""Redis losing a live run's shared state (restarted empty, flushed, failed over without the
latest writes) is noticed: the run ends `lost`, not `finished`, with a non-zero exit, nothing is
marked gone, and the next start says it begins afresh from the seeds, and stores everything.

On a private redis-server (the fault is injected into it, never into the machine's own).
"""

from __future__ import annotations

import re

from support.crawls import assert_each_product_stored_or_rejected_once, crawl_env, run_scrapy
from support.processes import start_crawl, wait_for

from scraper.demo_site import Catalog, DemoSite


def test_a_flushed_redis_ends_the_run_lost_and_the_next_starts_fresh(clean, own_redis) -> None:  # noqa: F811
    catalog = Catalog(products=80)
    url = f"redis://127.0.0.1:{own_redis.connection_pool.connection_kwargs['port']}/0"
    with DemoSite(catalog, delay_ms=40) as site:
        env = crawl_env(
            clean, REDIS_URL=url, DEMO_SITE_URL=site.url, CONCURRENT_REQUESTS="4", SCHEDULER_IDLE_TIMEOUT="3"
        )
        first = run_scrapy(env, "crawl", "demo")  # a whole run: rows to keep
        assert first.returncode == 0, first.stderr[-3000:]
        rows_before = clean.query("SELECT count(*) FROM products WHERE gone_at IS NULL")[0][0]
        site.reset_stats()
        crawl = start_crawl(env)
        wait_for(lambda: site.stats()["total"] > 20, timeout=60, step=0.05)
        own_redis.flushall()
        _out, log = crawl.communicate(timeout=120)
        fetched = site.stats()["total"]
        assert crawl.returncode == 4, log[-3000:]
        assert "Traceback" not in log, log[-5000:]
        assert re.search(r"Run 2 of demo lost its shared state: Redis has no record of it any more", log), log[-3000:]
        assert "'run/outcome': 'lost'" in log and "nothing is marked gone" in log, log[-3000:]
        assert fetched < len(catalog.pages())  # cut short: the rest of its queue was in Redis
        # Nothing marked gone on the strength of a lost run.
        assert clean.query("SELECT count(*) FROM products WHERE gone_at IS NOT NULL")[0][0] == 0
        assert clean.query("SELECT count(*) FROM products WHERE gone_at IS NULL")[0][0] == rows_before
        assert clean.query("SELECT state FROM crawl_runs WHERE spider = 'demo' AND run_id = 2") == [("lost",)]

        again = run_scrapy(env, "crawl", "demo")
        assert again.returncode == 0, again.stderr[-3000:]
        assert "Run 2 of demo is recorded as lost in Postgres, but Redis has no record of it" in again.stderr
        assert "Starting a fresh run 3 from the seeds" in again.stderr, again.stderr[-3000:]
    assert_each_product_stored_or_rejected_once(clean.query, catalog)
    assert clean.query("SELECT count(*) FROM products WHERE gone_at IS NOT NULL")[0][0] == 0


def test_a_fresh_run_begun_in_the_emptied_redis_does_not_hide_the_loss(clean, own_redis) -> None:  # noqa: F811
    """Redis emptied, and before the running node looks again, a new node begins run 2 there: the
    running node's run 1 is still lost (its marker is gone), not 'gone' as if others had
    finished it, and the new node's run goes on."""
    catalog = Catalog(products=60)
    url = f"redis://127.0.0.1:{own_redis.connection_pool.connection_kwargs['port']}/0"
    with DemoSite(catalog, delay_ms=60) as site:
        env = crawl_env(
            clean, REDIS_URL=url, DEMO_SITE_URL=site.url, CONCURRENT_REQUESTS="2", SCHEDULER_IDLE_TIMEOUT="3"
        )
        first = start_crawl(env)
        wait_for(lambda: site.stats()["total"] > 10, timeout=60, step=0.05)
        own_redis.flushall()
        own_redis.hset("{demo}:run", mapping={"id": "2", "state": "running", "started": "0"})  # the new node's
        own_redis.set("{demo}:run:2:marker", "0")
        _out, log = first.communicate(timeout=120)
        assert first.returncode == 4, log[-3000:]
        assert re.search(r"Run 1 of demo lost its shared state", log), log[-3000:]
        assert "'run/outcome': 'lost'" in log, log[-3000:]
        assert clean.query("SELECT count(*) FROM products WHERE gone_at IS NOT NULL")[0][0] == 0


def test_a_run_begun_by_another_node_between_the_two_looks_is_not_called_lost(clean, monkeypatch, caplog) -> None:
    # A node looks in Redis (no run record), then in Postgres. Another node begins a run in
    # between: its record reaches Redis, then its row Postgres ('running'). Nothing was lost.
    from scrapy.utils.test import get_crawler

    from scraper.node.membership import RunMembership
    from scraper.queue import keys
    from scraper.runs import record
    from scraper.runs.state import RunState

    server = clean.redis()
    conn = record.connect(clean.database_url)
    conn.close()
    real_last_run = record.last_run

    def another_node_begins(dsn: str, spider: str) -> tuple[int, str]:
        server.hset(keys.run_key(spider), mapping={"id": 1, "state": "running"})
        c = record.connect(dsn)
        try:
            record.upsert(c, spider, 1, {"state": "running"}, {}, 1)
        finally:
            c.close()
        return real_last_run(dsn, spider)

    monkeypatch.setattr(record, "last_run", another_node_begins)
    crawler = get_crawler(settings_dict={"DATABASE_URL": clean.database_url})
    member = RunMembership(crawler, "demo", RunState(server, "demo", None, "demo:q"), None, None, 60.0, print)
    with caplog.at_level("WARNING"):
        assert member.lowest_next_id() == 1
    assert "shared state (queue, seen-set) was lost" not in caplog.text
    # The genuine loss is still said: Postgres has run 1 running, Redis has no record of it.
    server.delete(keys.run_key("demo"))
    monkeypatch.setattr(record, "last_run", real_last_run)
    with caplog.at_level("WARNING"):
        assert member.lowest_next_id() == 1
    assert "Run 1 of demo is recorded as running in Postgres, but Redis has no record of it" in caplog.text
