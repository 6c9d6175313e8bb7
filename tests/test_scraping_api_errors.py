"""A canary key through every error path of every provider.

Each provider's stand-in answers different product pages with a different failure (429, 5xx,
504 billed or refunded, a timeout, a blocked target, a failed or expired job, a wrong base URL,
a paywall, a refused connection...), in one real crawl. Then ``scrapy dlq list/show/requeue``
and a second run, then the stops (no credits, a refused key). Throughout, the key must be
absent from every Redis key and value, a ``pg_dump``, the DEBUG logs and stats, the metrics and
``ps``; and each page must end as a row, a reject or a dead letter *of the target URL*.
"""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pgserver
import pytest
from support.crawls import (
    ROOT,
    Services,
    assert_each_product_stored_or_rejected_once,
    crawl_env,
    run_scrapy,
    scrapy_cmd,
)
from support.queue import queue_depth, queue_put

from scraper.demo_site import Catalog, DemoSite
from scraper.scraping_api.standin import StandIn

KEY = "canary-errpath-4f1e9b7d2c"
PRODUCTS = 30


@pytest.fixture(scope="module")
def shop():
    with DemoSite(Catalog(products=PRODUCTS)) as running:
        yield running


@pytest.fixture
def api():
    with StandIn(KEY) as running:
        yield running


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick(catalog: Catalog, n: int) -> list[int]:
    """*n* valid products with a single page each, so one rule decides each page's fate."""
    ids = [p.id for p in catalog.valid_products() if len(p.paths) == 1]
    assert len(ids) >= n
    return ids[:n]


def env_for(services: Services, site: DemoSite, api_url: str, provider: str, **extra: str) -> dict[str, str]:
    env = crawl_env(services, DEMO_SITE_URL=site.url)
    env.update(
        SCRAPING_API_KEY=KEY,
        SCRAPING_API_URL=api_url,
        SCRAPING_API_PROVIDER=provider,
        SCRAPING_API_RETRY_BACKOFF="0.02",
        SCRAPING_API_POLL_INTERVAL="0.05",
        SCRAPING_API_MAX_RETRIES="2",
        LOG_LEVEL="DEBUG",
        METRICS_ENABLED="false",
        DOWNLOAD_TIMEOUT="3",
    )
    env.update(extra)
    return env


class Watched:
    """A crawl run as a real process while ``ps`` and its metrics endpoint are read."""

    def __init__(self, env: dict[str, str], metrics_port: int | None = None) -> None:
        self.ps: list[str] = []
        self.metrics: list[str] = []
        self.proc = subprocess.Popen(
            scrapy_cmd("crawl", "demo"), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(metrics_port,), daemon=True)
        self._thread.start()

    def _watch(self, port: int | None) -> None:
        deadline = time.monotonic() + 150
        while not self._stop.is_set() and time.monotonic() < deadline:
            self.ps.append(subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout)
            if port:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                        self.metrics.append(response.read().decode())
                except OSError:
                    pass
            self._stop.wait(0.3)

    def finish(self) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=180)
        self._stop.set()
        self._thread.join(timeout=10)
        return self.proc.returncode, out, err


def redis_texts(services: Services) -> list[bytes]:
    """Every key and value in the test's Redis database, whatever its type."""
    r = services.redis()
    texts: list[bytes] = []
    for key in r.scan_iter(count=1000):
        texts.append(key)
        kind = r.type(key)
        if kind == b"string":
            texts.append(r.get(key) or b"")
        elif kind == b"list":
            texts.extend(r.lrange(key, 0, -1))
        elif kind == b"set":
            texts.extend(r.smembers(key))
        elif kind == b"zset":
            texts.extend(r.zrange(key, 0, -1))
        elif kind == b"hash":
            texts.extend(b"%s=%s" % kv for kv in r.hgetall(key).items())
        else:
            texts.append(r.dump(key) or b"")
    return texts


def assert_key_nowhere(services: Services, *texts: str) -> None:
    for blob in texts:
        assert KEY not in blob
    for value in redis_texts(services):
        assert KEY.encode() not in value, value[:300]
    # The pg_dump bundled with the embedded Postgres: present wherever the project is installed,
    # and new enough for the machine's server too.
    pg_dump = Path(pgserver.__file__).parent / "pginstall" / "bin" / "pg_dump"
    dump = subprocess.run([str(pg_dump), "--data-only", services.database_url], capture_output=True, text=True)
    assert dump.returncode == 0, dump.stderr
    assert KEY not in dump.stdout


def dead_letters(services: Services) -> dict[str, str]:
    """url -> reason of every dead letter."""
    import json

    return {json.loads(raw)["url"]: json.loads(raw)["reason"] for raw in services.redis().lrange("{demo}:dead", 0, -1)}


def stat(stderr: str, name: str) -> Any:
    dump = stderr.rpartition("Dumping Scrapy stats:")[2]
    m = re.search(rf"'{re.escape(name)}': ('[^']*'|[0-9.]+)", dump)
    return None if m is None else (m[1].strip("'") if m[1].startswith("'") else float(m[1]))


def run_phases(
    services: Services,
    shop: DemoSite,
    api: StandIn,
    provider: str,
    cases: list[tuple[dict[str, Any], str | None]],
    stops: list[tuple[dict[str, Any], str]],
    **extra: str,
) -> None:
    """Phase 1: one crawl where product i gets cases[i]'s rule; *expected* None means the page
    ends stored, a string is the dead-letter reason. Then dlq list/show/requeue and a clean
    second run; then each stop rule closes a crawl with its finish reason and keeps the queue."""
    ids = pick(shop.catalog, len(cases))
    rules, expected_dead = [], {}
    for pid, (rule, reason) in zip(ids, cases):
        if "block" in rule:
            api.configure(block=[f"/p/{pid}.html"])
        else:
            rules.append(dict(rule, match=f"/p/{pid}.html"))
        if reason is not None:
            expected_dead[shop.url.rstrip("/") + shop.catalog.product(pid).paths[0]] = reason
    api.configure(rules=rules)
    port = free_port()
    env = env_for(services, shop, api.url, provider, **extra)
    watched = Watched(
        dict(env, METRICS_ENABLED="true", METRICS_PORT=str(port), METRICS_PORT_RANGE="1", METRICS_LINGER="1"),
        metrics_port=port,
    )
    code, out, err = watched.finish()
    assert code == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert stat(err, "finish_reason") == "finished"
    dead = dead_letters(services)
    assert {u: r for u, r in dead.items()} == expected_dead, (dead, expected_dead)
    # The dead letters are the target requests, never the API calls.
    assert all(u.startswith(shop.url.rstrip("/")) for u in dead)
    assert stat(err, "dead_letters/api") == len(expected_dead)
    served = api.stats()
    assert served["key_in_url"] == 0 and served["unknown_fields"] == {}
    assert watched.metrics, "the metrics endpoint was never read"
    assert_key_nowhere(services, out, err, *watched.ps, *watched.metrics)

    listing = run_scrapy(env, "dlq", "list", "demo")
    shown = run_scrapy(env, "dlq", "show", "demo", "0")
    assert listing.returncode == shown.returncode == 0, listing.stderr + shown.stderr
    assert all(u in listing.stdout for u in expected_dead)
    api.configure(rules=[], block=[])
    requeued = run_scrapy(env, "dlq", "requeue", "demo", "--reason", "api")
    assert f"requeued {len(expected_dead)} dead letter(s)" in requeued.stdout, requeued.stdout + requeued.stderr
    assert_key_nowhere(services, listing.stdout, listing.stderr, shown.stdout, shown.stderr, requeued.stdout)

    second = run_scrapy(env, "crawl", "demo", timeout=180)
    assert second.returncode == 0 and stat(second.stderr, "finish_reason") == "finished", second.stderr[-3000:]
    assert dead_letters(services) == {}
    assert_each_product_stored_or_rejected_once(services.query, shop.catalog)
    assert_key_nowhere(services, second.stdout, second.stderr)

    for rule, reason in stops:
        services.redis().flushdb()
        api.configure(rules=[dict(rule, count=0)])
        stopped = run_scrapy(env, "crawl", "demo", timeout=180)
        assert stopped.returncode == 5, stopped.stderr[-3000:]  # stopped, not finished
        assert stat(stopped.stderr, "finish_reason") == reason
        assert "requests left in the shared queue" in stopped.stderr
        assert queue_depth(services.redis(), "{demo}:requests") > 0  # the queue is kept for the next run
        assert dead_letters(services) == {}  # a stop is not the page's fault
        assert_key_nowhere(services, stopped.stdout, stopped.stderr)


def test_alterlab_every_error_path(clean, shop, api) -> None:
    run_phases(
        clean,
        shop,
        api,
        "alterlab",
        [
            ({"status": 429, "count": 1, "retry_after": 0}, None),
            ({"status": 500, "count": 1}, None),
            ({"status": 504, "count": 0, "error": "GATEWAY_TIMEOUT"}, "api:504:GATEWAY_TIMEOUT"),  # may be billed
            ({"status": 504, "count": 1, "error": "TIMEOUT"}, None),  # refunded: retried
            ({"status": 403, "count": 0}, "api:403:BLOCKED_BY_ANTIBOT"),  # blocked even escalated
            ({"block": True}, None),  # blocked until escalated to render_js
            ({"status": 404, "count": 0}, "api:404:NOT_FOUND"),
            (
                {"status": 402, "count": 0, "error": "PAYWALL_DETECTED", "message": "paywall"},
                "api:402:PAYWALL_DETECTED",
            ),
            ({"job": "failed", "count": 1}, None),
            ({"job": "expired", "count": 1}, None),
            ({"job": "failed", "count": 0}, "api:job:failed"),
            ({"delay_ms": 3500, "count": 1}, None),  # the client's timeout, then a retry
            ({"status": 422, "count": 0}, "api:422:ALL_TIERS_FAILED"),
            ({"status": 503, "count": 0}, "api:503:SERVICE_UNAVAILABLE"),
        ],
        stops=[
            (
                {"status": 402, "error": "INSUFFICIENT_CREDITS", "message": "Insufficient balance", "after": 4},
                "scraping_api_credits",
            ),
            ({"status": 401, "after": 4}, "scraping_api_auth"),
        ],
    )


def test_scrapingbee_every_error_path(clean, shop, api) -> None:
    run_phases(
        clean,
        shop,
        api,
        "scrapingbee",
        [
            ({"status": 429, "count": 1, "retry_after": 0}, None),
            ({"status": 500, "count": 1}, None),
            ({"status": 500, "count": 0}, "api:500:http_500"),
            ({"status": 400, "count": 0}, "api:400:http_400"),
            ({"delay_ms": 3500, "count": 1}, None),
        ],
        stops=[
            ({"status": 401, "error": "no_credits", "after": 4}, "scraping_api_credits"),
            ({"status": 401, "after": 4}, "scraping_api_auth"),
        ],
    )


def test_zyte_every_error_path(clean, shop, api) -> None:
    run_phases(
        clean,
        shop,
        api,
        "zyte",
        [
            ({"status": 429, "count": 1, "retry_after": 0}, None),  # throttled: waits, retries
            ({"status": 520, "count": 2}, None),  # a temporary download error: retried (up to 4 tries)
            ({"status": 520, "count": 0}, "api:520:temporary-error"),
            ({"status": 521, "count": 0}, "api:521:permanent-error"),  # 2 tries
            ({"status": 500, "count": 0}, "api:500:error"),  # undocumented: 2 tries
            ({"status": 503, "count": 1}, None),
        ],
        stops=[
            ({"status": 401, "after": 4}, "scraping_api_auth"),
        ],
    )
    served = api.stats()["calls"]
    assert served.get("zyte", 0) > 0 and "alterlab" not in served


def test_unreachable_api_and_wrong_base_url_end_as_dead_letters(clean, shop, api) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    refused = run_scrapy(env_for(clean, shop, closed, "alterlab", SCRAPING_API_MAX_RETRIES="1"), "crawl", "demo")
    assert refused.returncode == 0, refused.stderr[-3000:]
    dead = dead_letters(clean)
    assert list(dead) == [shop.url] and dead[shop.url].startswith("api:599:")  # the start page, not an API URL
    assert_key_nowhere(clean, refused.stdout, refused.stderr)

    clean.redis().flushdb()
    wrong = run_scrapy(env_for(clean, shop, api.url + "/api/v1", "alterlab"), "crawl", "demo")
    assert wrong.returncode == 0, wrong.stderr[-3000:]
    assert dead_letters(clean) == {shop.url: "api:404:NOT_FOUND"}
    assert "is SCRAPING_API_URL right?" in wrong.stderr
    assert_key_nowhere(clean, wrong.stdout, wrong.stderr)


def test_api_calls_left_by_an_earlier_version_are_deleted_never_sent_or_shown(clean, shop, api) -> None:
    """Earlier versions could dead-letter or requeue the API call itself, key included."""
    from scraper.queue import serializer
    from scraper.queue.dead_letters import entry

    call = {
        "url": f"{api.url}/api/v1/scrape",
        "method": "POST",
        "headers": {"X-Api-Key": [KEY]},
        "body": b'{"url": "%s"}' % shop.url.encode(),
        "meta": {"_scraping_api_call": True},
        "priority": 0,
        "dont_filter": True,
        "callback": None,
        "errback": None,
        "flags": [],
        "cb_kwargs": {},
        "cookies": {},
        "encoding": "utf-8",
    }
    data = serializer.dumps(call)
    r = clean.redis()
    r.rpush("{demo}:dead", entry("http 503", 3, call["url"], data))
    queue_put(r, "{demo}:requests", {data: 0})
    env = env_for(clean, shop, api.url, "alterlab")
    listing = run_scrapy(env, "dlq", "list", "demo")
    assert listing.returncode == 0, listing.stderr
    assert "deleted 1 dead letter(s) that were scraping-API calls" in listing.stderr
    assert "0 dead letter(s) shown" in listing.stdout and KEY not in listing.stdout + listing.stderr
    result = run_scrapy(env, "crawl", "demo")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "a scraping-API call queued by an earlier version" in result.stderr
    assert "/api/v1/scrape" not in "".join(api.stats()["targets"])  # never sent as a page
    assert_each_product_stored_or_rejected_once(clean.query, shop.catalog)
    assert_key_nowhere(clean, listing.stdout, result.stderr)


def test_an_answer_over_download_maxsize_is_a_dead_letter_at_once(clean, shop, api) -> None:
    result = run_scrapy(env_for(clean, shop, api.url, "alterlab", DOWNLOAD_MAXSIZE="3000"), "crawl", "demo")
    assert result.returncode == 0, result.stderr[-3000:]
    dead = dead_letters(clean)
    assert dead and set(dead.values()) == {"api:599:too_large"}
    assert all(u.startswith(shop.url) for u in dead)  # the target pages
    assert set(api.stats()["targets"].values()) == {1}  # as large the next time: not retried
