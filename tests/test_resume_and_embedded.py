"""Stopping and restarting continues where it left off; the embedded default is the same pipeline."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psycopg2
from scrapy.settings import Settings
from support.crawls import ROOT, crawl, crawl_env, run_scrapy, scrapy_cmd
from support.queue import queue_depth

from scraper import backends
from scraper.demo_site import Catalog, DemoSite


def test_stopped_crawl_resumes_where_it_left_off(clean, catalog: Catalog) -> None:
    site = DemoSite(catalog, delay_ms=50).start()
    try:
        env = crawl_env(clean, DEMO_SITE_URL=site.url, CONCURRENT_REQUESTS_PER_DOMAIN="2")
        proc = subprocess.Popen(
            scrapy_cmd("crawl", "demo"), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 60
        while site.stats()["total"] < 30 and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C does: a graceful stop
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        assert "Spider closed (shutdown)" in err
        queued = queue_depth(clean.redis(), "{demo}:requests")
        assert queued > 0, "the stop came too late to leave work in the queue"
        stored_first = clean.query("SELECT count(*) FROM products")[0][0]
        assert stored_first < len(catalog.valid_products())

        result = run_scrapy(env, "crawl", "demo")
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"resuming run 1 of demo ({queued:,} queued)" in result.stderr
        rows = clean.query("SELECT sku FROM products")
        assert sorted(r[0] for r in rows) == sorted(p.sku for p in catalog.valid_products())
        # No page was fetched twice: the second run took over the first run's queue and seen-set.
        counts = site.stats()["requests"]
        assert {p: c for p, c in counts.items() if c > 1 and p != "/robots.txt"} == {}
        assert sorted(p for p in counts if p != "/robots.txt") == sorted(catalog.pages())
    finally:
        site.stop()


def test_finished_crawl_clears_its_seen_set_so_the_next_run_recrawls(clean, site: DemoSite) -> None:
    first = crawl(clean, site)
    assert "starting run 1 of demo" in first.stderr
    # Only the run's record is left: state finished, and its figures for `scrapy runs` (and the
    # URL aliases learnt from canonical links, kept for the next runs).
    server = clean.redis()
    assert sorted(server.keys("{demo}:*")) == [
        b"{demo}:aliases",
        b"{demo}:run",
        b"{demo}:run:1:figures",
        b"{demo}:run:1:marker",
        b"{demo}:run:1:quality",
    ]
    assert server.hget("{demo}:run", "state") == b"finished"
    site.reset_stats()
    second = crawl(clean, site)
    assert "starting run 2 of demo" in second.stderr
    assert site.stats()["requests"].get("/") == 1


def test_embedded_default_stores_the_catalog_and_keeps_it(tmp_path, site: DemoSite, catalog: Catalog) -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DATABASE_URL"}}
    env.update(
        DATA_DIR=str(tmp_path / "data"), DEMO_SITE_URL=site.url, SCHEDULER_IDLE_TIMEOUT="1", PYTHONPATH=str(ROOT)
    )
    result = run_scrapy(env, "crawl", "demo")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Using the embedded Redis" in result.stderr and "Using the embedded Postgres" in result.stderr
    assert (tmp_path / "data" / "redis").is_dir() and (tmp_path / "data" / "postgres").is_dir()
    # The crawl's servers have stopped with it; the data is still there on the next start.
    found = backends.resolve(Settings({"DATA_DIR": str(tmp_path / "data")}))
    conn = psycopg2.connect(found.database_url)
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM products WHERE source = 'demo'")
        assert cur.fetchone()[0] == len(catalog.valid_products())
    conn.close()
