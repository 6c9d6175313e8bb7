"""Postgres going away mid-crawl: the crawl holds still, loses nothing, and finishes when it is
back; if it stays away, the unstored pages become dead letters and nothing is lost either.

These tests run their own Postgres (pgserver's binaries, a throwaway data folder) so that they
can really stop it: the machine's shared server is left alone.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psycopg2
import pytest
from support.crawls import assert_each_product_stored_or_rejected_once, crawl_env, run_scrapy
from support.processes import start_crawl, wait_for
from support.queue import queue_depth
from support.servers import StoppablePostgres

from scraper.demo_site import Catalog, DemoSite


@pytest.fixture
def postgres(tmp_path: Path):
    pg = StoppablePostgres(tmp_path / "pg")
    try:
        yield pg
    finally:
        try:
            pg.server.cleanup()
        except Exception:
            pass


def assert_every_product_once(pg: StoppablePostgres, catalog: Catalog) -> None:
    assert_each_product_stored_or_rejected_once(pg.query, catalog)


def plateau(site: DemoSite, quiet: float, timeout: float) -> int:
    """Wait until the site sees no request for *quiet* seconds; returns its request count."""
    deadline = time.monotonic() + timeout
    last, since = site.stats()["total"], time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = site.stats()["total"]
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return now
    raise AssertionError(f"the crawl kept fetching while the database was down ({last} requests)")


def test_postgres_down_mid_crawl_then_back(clean, postgres: StoppablePostgres) -> None:
    catalog = Catalog(products=150)
    with DemoSite(catalog, delay_ms=40) as site:
        # The lease cap (2 x 4) would stop the crawl before 20 rows wait: raised, so that
        # the writer's own backpressure is what holds it here.
        env = crawl_env(
            clean,
            DATABASE_URL=postgres.url,
            DEMO_SITE_URL=site.url,
            CONCURRENT_REQUESTS="4",
            POSTGRES_MAX_PENDING="20",
            SCHEDULER_LEASE_TIMEOUT="3",
            SCHEDULER_IDLE_TIMEOUT="5",
            POSTGRES_RETRY_TIMEOUT="300",
            SCHEDULER_MAX_LEASES="64",
        )
        workers = [start_crawl(env) for _ in range(2)]
        wait_for(lambda: postgres.count("products") >= 15, timeout=60)
        postgres.stop()
        stopped_at = site.stats()["total"]
        # Backpressure: once 20 rows wait per worker, no new download starts.
        held = plateau(site, quiet=3.0, timeout=30)
        assert held - stopped_at <= 2 * (20 + 4 + 8), (stopped_at, held)
        # Requests whose items are not committed stay leased, not acknowledged...
        leased = clean.redis().hlen("{demo}:leased")
        assert leased > 0
        # ...so a worker that dies now loses nothing: the survivor gets its requests back.
        workers[0].proc.send_signal(signal.SIGKILL)
        time.sleep(1)
        postgres.start()
        survivor_log = workers[1].communicate(timeout=180)[1]
        workers[0].communicate(timeout=10)
        counts = site.stats()["requests"]
    assert workers[1].returncode == 0, survivor_log[-3000:]
    assert "Spider closed (finished)" in survivor_log, survivor_log[-3000:]
    assert "Database unavailable" in survivor_log
    assert "holding new downloads" in survivor_log and "downloading again" in survivor_log
    assert "back in the queue" in survivor_log  # the killed worker's leases were reaped
    pages = {p: n for p, n in counts.items() if p != "/robots.txt"}
    assert sorted(pages) == sorted(catalog.pages())
    assert_every_product_once(postgres, catalog)
    redis = clean.redis()
    assert redis.llen("{demo}:dead") == 0
    assert redis.zcard("{demo}:lease_deadlines") == 0 and redis.hlen("{demo}:leased") == 0


def test_postgres_gone_for_good_leaves_dead_letters_to_requeue(clean, postgres: StoppablePostgres) -> None:
    catalog = Catalog(products=100)
    with DemoSite(catalog, delay_ms=50) as site:
        env = crawl_env(
            clean,
            DATABASE_URL=postgres.url,
            DEMO_SITE_URL=site.url,
            CONCURRENT_REQUESTS="4",
            POSTGRES_RETRY_TIMEOUT="3",
            POSTGRES_MAX_PENDING="10",
            SCHEDULER_IDLE_TIMEOUT="3",
        )
        worker = start_crawl(env)
        wait_for(lambda: postgres.count("products") >= 10, timeout=60)
        postgres.stop()
        log = worker.communicate(timeout=120)[1]
        assert worker.returncode == 5, log[-3000:]  # stopped: not a finished run
        assert "Spider closed (postgres_unavailable)" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        assert "scrapy dlq requeue demo --reason store" in log  # the way back, told to the operator
        redis = clean.redis()
        dead = redis.llen("{demo}:dead")
        assert dead > 0
        assert queue_depth(redis, "{demo}:requests") > 0  # the rest of the crawl waits in the queue
        listing = run_scrapy(env, "dlq", "list", "demo")
        assert listing.stdout.count("store: database unavailable") == dead, listing.stdout[-2000:]

        postgres.start()
        requeued = run_scrapy(env, "dlq", "requeue", "demo", "--reason", "store")
        assert requeued.returncode == 0, requeued.stderr[-2000:]
        again = run_scrapy(env, "crawl", "demo", timeout=180)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "Spider closed (finished)" in again.stderr
    assert redis.llen("{demo}:dead") == 0
    assert_every_product_once(postgres, catalog)


def test_a_locked_table_is_said_with_the_blocking_pid(clean) -> None:
    # A slow site keeps the crawl going while the table is locked; the writer's batch then waits.
    with DemoSite(Catalog(products=60), delay_ms=150) as site:
        env = crawl_env(clean, DEMO_SITE_URL=site.url, POSTGRES_STALL_WARN_SECONDS="2")
        crawl = start_crawl(env)

        def stored() -> bool:
            try:
                return clean.query("SELECT EXISTS (SELECT 1 FROM products)")[0][0]
            except psycopg2.errors.UndefinedTable:
                return False

        wait_for(stored, timeout=30, step=0.1)
        locker = psycopg2.connect(clean.database_url)
        with locker.cursor() as cur:
            cur.execute("LOCK TABLE products IN ACCESS EXCLUSIVE MODE")
            cur.execute("SELECT pg_backend_pid()")
            blocker = cur.fetchone()[0]
        time.sleep(7)
        locker.rollback()
        locker.close()
        _, log = crawl.communicate(timeout=60)
    assert crawl.returncode == 0, log[-3000:]
    warnings_said = [line for line in log.splitlines() if "Database stalled" in line]
    assert 2 <= len(warnings_said) <= 4, log[-3000:]  # every 2 s of the ~7 s lock, not more
    assert any(
        f"blocked by pids {blocker}" in line and "rows waiting" in line and "Lock/relation" in line
        for line in warnings_said
    ), warnings_said
    assert_each_product_stored_or_rejected_once(clean.query, site.catalog)
