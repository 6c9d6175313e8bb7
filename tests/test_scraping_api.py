"""Crawling through the scraping API, end to end: real ``scrapy crawl`` processes, the real demo
site, real Redis and Postgres, and the local AlterLab stand-in (in a thread of this process).

"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support.crawls import ROOT, run_scrapy, scrapy_cmd
from support.queue import queue_depth
from support.scraping_api import KEY, api_env

from scraper.demo_site import Catalog, DemoSite
from scraper.scraping_api.standin import STANDIN_HEADER, StandIn


@pytest.fixture
def api():
    with StandIn(KEY) as running:
        yield running


@pytest.fixture(scope="module")
def small_site():
    with DemoSite(Catalog(products=40)) as running:
        yield running


def run_crawl(env: dict[str, str], ok: bool = True, status: int = 0) -> subprocess.CompletedProcess:
    result = run_scrapy(env, "crawl", "demo", timeout=120)
    if ok:
        assert result.returncode == status, result.stderr[-3000:]
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result


def stat(result: subprocess.CompletedProcess, name: str) -> float | str | None:
    dump = result.stderr.rpartition("Dumping Scrapy stats:")[2]
    m = re.search(rf"'{re.escape(name)}': ('[^']*'|[0-9.]+)", dump)
    if m is None:
        return None
    value = m[1]
    return value.strip("'") if value.startswith("'") else float(value)


def table(services, name: str) -> list[tuple]:
    cols = [
        c
        for (c,) in services.query(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
            (name,),
        )
        if c not in {"id", "first_seen", "last_seen", "updated_at", "created_at"}
    ]
    return sorted(services.query(f"SELECT {', '.join(cols)} FROM {name}"), key=repr)


def reset(services) -> None:
    services.redis().flushdb()
    services.query("DROP SCHEMA public CASCADE; CREATE SCHEMA public")


# -- the same rows, the key nowhere ----------------------------------------------------------


def test_crawl_through_api_stores_the_same_rows_and_the_key_is_nowhere(clean, site: DemoSite, api: StandIn) -> None:
    direct = run_crawl(api_env(clean, site.url, None))
    assert "ScrapingApiMiddleware" not in direct.stderr.split("Enabled downloader middlewares")[1].split("]")[0]
    direct_products, direct_rejects = table(clean, "products"), table(clean, "rejects")
    assert len(direct_products) > 50

    reset(clean)
    result = run_crawl(api_env(clean, site.url, api, LOG_LEVEL="DEBUG", CONCURRENT_REQUESTS_PER_DOMAIN="3"))
    assert table(clean, "products") == direct_products
    assert table(clean, "rejects") == direct_rejects
    served = api.stats()
    assert served["bad_keys"] == 0 and served["fetches"] > len(direct_products)
    assert stat(result, "scraping_api/credits") == served["credits"]
    assert stat(result, f"scraping_api/credits/{site.host}") == served["credits"]
    assert stat(result, "finish_reason") == "finished"
    # Per-domain concurrency holds through the API: the site never saw more than 3 at once.
    assert 1 <= served["max_concurrent"][f"{site.host}:{site.port}"] <= 3

    # The canary key: not in any log line (DEBUG), the stats, Redis or Postgres.
    assert "Fetching through the alterlab API" in result.stderr
    assert KEY not in result.stdout + result.stderr
    r = clean.redis()
    for key in r.scan_iter(count=1000):
        assert KEY.encode() not in key
        kind = r.type(key)
        if kind == b"string":
            values = [r.get(key)]
        elif kind == b"list":
            values = r.lrange(key, 0, -1)
        elif kind == b"set":
            values = list(r.smembers(key))
        elif kind == b"zset":
            values = r.zrange(key, 0, -1)
        elif kind == b"hash":
            values = [b"%s=%s" % kv for kv in r.hgetall(key).items()]
        else:
            values = [r.dump(key) or b""]
        assert not any(KEY.encode() in (v or b"") for v in values), key
    for (name,) in clean.query("SELECT tablename FROM pg_tables WHERE schemaname = 'public'"):
        hits = clean.query(f"SELECT count(*) FROM {name} t WHERE t::text LIKE %s", (f"%{KEY}%",))
        assert hits == [(0,)], name


# -- the API misbehaves ----------------------------------------------------------------------


def test_429_and_5xx_are_retried_honouring_retry_after(clean, small_site, api) -> None:
    api.configure(
        rules=[
            {"status": 429, "count": 3, "retry_after": 1},
            {"status": 503, "count": 2},
            {"status": 500, "count": 1, "after": 10},
        ]
    )
    started = time.monotonic()
    result = run_crawl(api_env(clean, small_site.url, api))
    products = clean.query("SELECT count(*) FROM products")[0][0]
    assert products == len(small_site.catalog.valid_products())
    assert stat(result, "scraping_api/retries/429") == 3
    assert stat(result, "scraping_api/retries/503") == 2
    assert stat(result, "scraping_api/retries/500") == 1
    assert stat(result, "finish_reason") == "finished"
    assert time.monotonic() - started >= 1.0  # Retry-After was waited for (without a blocking sleep)


def test_retries_are_bounded(clean, small_site, api) -> None:
    api.configure(rules=[{"status": 502, "count": 0}])  # every answer: 502
    result = run_crawl(api_env(clean, small_site.url, api, SCRAPING_API_MAX_RETRIES="2"), ok=False)
    assert result.returncode == 0
    # robots.txt is fetched directly; the start page is tried 3 times, then set aside.
    assert api.stats()["scrapes"] == 3 * stat(result, "scraping_api/failed") == 3
    assert "/robots.txt" not in "".join(api.stats()["targets"])
    assert stat(result, "finish_reason") == "finished"
    assert "the scraping API failed 3 time(s)" in result.stderr
    assert stat(result, "dead_letters/api") == 1
    assert "Traceback" not in result.stderr
    assert KEY not in result.stderr


def test_202_jobs_are_polled_and_expired_jobs_resubmitted(clean, small_site, api) -> None:
    api.configure(async_jobs=True, job_ready_polls=2, expire_jobs=3, fail_jobs=2)
    result = run_crawl(api_env(clean, small_site.url, api))
    assert clean.query("SELECT count(*) FROM products")[0][0] == len(small_site.catalog.valid_products())
    served = api.stats()
    assert stat(result, "scraping_api/jobs") == served["jobs"] > 0
    assert stat(result, "scraping_api/jobs_expired") == served["expired"] == 3
    # A failed job is final: submitted again, never polled again.
    assert stat(result, "scraping_api/jobs_failed") == served["failed_jobs"] == 2
    assert served["polls"] >= 2 * (served["jobs"] - 3)
    assert stat(result, "scraping_api/credits") == served["credits"]


def test_401_closes_the_spider_at_once_and_keeps_the_queue(clean, small_site, api) -> None:
    api.configure(rules=[{"status": 401, "count": 0, "after": 5, "detail": "API key revoked"}])
    result = run_crawl(api_env(clean, small_site.url, api), status=5)
    assert stat(result, "finish_reason") == "scraping_api_auth"
    assert api.stats()["scrapes"] < 5 + 40  # stopped at once, not after every queued page
    assert "requests left in the shared queue" in result.stderr


def test_402_closes_with_credits_reason_and_the_next_run_finishes_the_crawl(clean, small_site, api) -> None:
    api.configure(rules=[{"status": 402, "count": 0, "after": 8, "detail": "Insufficient credits"}])
    env = api_env(clean, small_site.url, api)
    result = run_crawl(env, status=5)
    assert stat(result, "finish_reason") == "scraping_api_credits"
    assert "requests left in the shared queue" in result.stderr
    # Credits topped up: the next run resumes from the queue and nothing was lost.
    api.configure(rules=[])
    second = run_crawl(env)
    assert stat(second, "finish_reason") == "finished"
    assert clean.query("SELECT count(*) FROM products")[0][0] == len(small_site.catalog.valid_products())


def test_slow_api_calls_time_out_and_are_retried(clean, small_site, api) -> None:
    # A timeout well above a loaded machine's slowest answer (1 s saw 5 more time out in CI),
    # and a delay well above the timeout.
    api.configure(rules=[{"delay_ms": 7000, "count": 2}])
    result = run_crawl(api_env(clean, small_site.url, api, DOWNLOAD_TIMEOUT="3"))
    assert stat(result, "scraping_api/retries/599") == 2
    assert clean.query("SELECT count(*) FROM products")[0][0] == len(small_site.catalog.valid_products())


def test_budget_stops_the_crawl_before_it_is_exceeded(clean, small_site, api) -> None:
    # AlterLab bills in microcents (billing.total_credits); the stand-in charges 200 a page.
    result = run_crawl(
        api_env(clean, small_site.url, api, SCRAPING_API_BUDGET="3000", CONCURRENT_REQUESTS_PER_DOMAIN="8"), status=5
    )
    assert stat(result, "finish_reason") == "scraping_api_budget"
    served = api.stats()
    assert served["credits"] <= 3000
    assert stat(result, "scraping_api/credits") == served["credits"] >= 3000 - 8 * 200
    assert "requests left in the shared queue" in result.stderr


def test_budget_counts_render_js_cost(clean, small_site, api) -> None:
    result = run_crawl(
        api_env(clean, small_site.url, api, SCRAPING_API_BUDGET="22000", SCRAPING_API_OPTIONS='{"render_js": true}'),
        status=5,
    )
    assert stat(result, "finish_reason") == "scraping_api_budget"
    assert 15000 <= api.stats()["credits"] <= 22000  # 1000 a rendered page


# -- routing ---------------------------------------------------------------------------------


class _Guarded(BaseHTTPRequestHandler):
    """A site that answers 403 unless the request comes from the stand-in."""

    protocol_version = "HTTP/1.1"
    site: DemoSite
    direct: list[str]

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        if self.headers.get(STANDIN_HEADER) != "1":
            type(self).direct.append(self.path)
            body, status, ctype = b"<html><title>Access Denied</title></html>", 403, "text/html"
            extra = ()
        else:
            path, _, query = self.path.partition("?")
            page = self.site.page(path, query)
            status, ctype = page.status, page.content_type
            body = page.body_for(f"http://{self.headers['Host']}")
            extra = page.headers
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


def test_on_block_escalates_a_blocking_site_and_crawls_it_fully(clean, api) -> None:
    site = DemoSite(Catalog(products=25))
    handler = type("Guarded", (_Guarded,), {"site": site, "direct": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        direct = run_crawl(api_env(clean, url, None))
        assert clean.query("SELECT count(*) FROM products")[0][0] == 0  # blocked without the API
        reset(clean)
        handler.direct.clear()
        result = run_crawl(
            api_env(clean, url, api, SCRAPING_API_DEFAULT_ROUTE="never", SCRAPING_API_ROUTING="127.0.0.1=on_block")
        )
        assert clean.query("SELECT count(*) FROM products")[0][0] == len(site.catalog.valid_products())
        assert stat(result, "scraping_api/escalated_domains") == 1
        # Only the first direct requests (robots.txt, the start page) were blocked; then all went via the API.
        assert len(handler.direct) <= 2, handler.direct
        assert direct.returncode == 0
    finally:
        server.shutdown()
        server.server_close()


# -- the fleet shares one budget and one escalation memory --------------------------------------


def test_four_workers_share_one_budget(clean, api) -> None:
    with DemoSite(Catalog(products=80)) as site:
        env = api_env(clean, site.url, api, SCRAPING_API_BUDGET="6000", CONCURRENT_REQUESTS_PER_DOMAIN="2")
        procs = [
            subprocess.Popen(
                scrapy_cmd("crawl", "demo"),
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        outputs = [p.communicate(timeout=180) for p in procs]
    reasons = [stat(type("R", (), {"stderr": err})(), "finish_reason") for _, err in outputs]
    # A worker the budget stopped says so in its exit status (5: stopped, not finished).
    assert [p.returncode for p in procs] == [5 if r == "scraping_api_budget" else 0 for r in reasons], [
        err[-2000:] for _, err in outputs
    ]
    served = api.stats()
    # 200 microcents a page: the fleet together stops at the budget, not at 4 times it.
    assert 6000 - 4 * 2 * 200 <= served["credits"] <= 6000
    spent = [stat(type("R", (), {"stderr": err})(), "scraping_api/credits") or 0 for _, err in outputs]
    assert sum(spent) == served["credits"]
    assert (
        sum(1 for _, err in outputs if stat(type("R", (), {"stderr": err})(), "finish_reason") == "scraping_api_budget")
        >= 1
    )
    assert queue_depth(clean.redis(), "{demo}:requests") > 0  # the rest of the run waits in the queue


def test_a_domain_escalated_by_one_worker_is_escalated_for_all(clean, api) -> None:
    site = DemoSite(Catalog(products=60))

    class Slow(_Guarded):
        def do_GET(self) -> None:  # noqa: N802
            time.sleep(0.05)  # slow enough that the first worker is still crawling when the second joins
            super().do_GET()

    handler = type("Guarded", (Slow,), {"site": site, "direct": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        env = api_env(
            clean,
            url,
            api,
            SCRAPING_API_DEFAULT_ROUTE="never",
            SCRAPING_API_ROUTING="127.0.0.1=on_block",
            CONCURRENT_REQUESTS_PER_DOMAIN="2",
        )
        first = subprocess.Popen(
            scrapy_cmd("crawl", "demo"), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 60
        while not clean.redis().smembers("{demo}:scraping_api:escalated") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert clean.redis().smembers("{demo}:scraping_api:escalated") == {b"127.0.0.1"}
        before = len(handler.direct)
        second = subprocess.Popen(
            scrapy_cmd("crawl", "demo"), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        (_, err1), (_, err2) = first.communicate(timeout=180), second.communicate(timeout=180)
    finally:
        server.shutdown()
        server.server_close()
    assert first.returncode == second.returncode == 0, err1[-2000:] + err2[-2000:]
    assert "escalated by another worker of this run" in err2
    assert len(handler.direct) - before <= 1, handler.direct  # robots.txt at most: it is fetched directly
    assert clean.query("SELECT count(*) FROM products")[0][0] == len(site.catalog.valid_products())
