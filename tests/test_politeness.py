"""Fleet-wide politeness: several crawl processes together stay within one domain's limits.

Judged where it matters, at the site: the demo site logs when each request arrived and how many
it served at once. Limits live in the test session's real Redis; crawls are real processes.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from scrapy.settings import Settings
from support import crawls
from support.crawls import ROOT, run_scrapy
from support.errors import check_one_line_error
from support.processes import start_crawl
from support.scraping_api import api_env
from support.stats import stat

from scraper.config import ConfigError
from scraper.demo_site import Catalog, DemoSite
from scraper.politeness import adaptive, limiter, middleware, slow_start
from scraper.politeness.keys import inflight_key, start_key, waiting_key
from scraper.politeness.limits import DomainLimit, Limit, parse_overrides, read_policy
from scraper.scraping_api.standin import StandIn

# -- settings: parsing and matching ------------------------------------------------------------


def crawl_env(services: Any, **extra: str) -> dict[str, str]:
    """The tests' crawl environment with this project's default politeness: a site nobody
    declared starts slowly here, as it does for a user."""
    env = crawls.crawl_env(services, **extra)
    if "POLITENESS_SLOW_START_RATE" not in extra:
        del env["POLITENESS_SLOW_START_RATE"]
    return env


def test_overrides_syntax() -> None:
    assert parse_overrides(" shop.test=rate:2/concurrency:4 , Slow.Test.=rate:0.5,cdn.test=rate:0") == {
        "shop.test": Limit(2.0, 4),
        "slow.test": Limit(0.5, None),
        "cdn.test": Limit(0.0, None),
    }
    assert parse_overrides("") == {}
    assert parse_overrides({"shop.test": {"concurrency": 3}, "10.0.0.1": "rate:1"}) == {
        "shop.test": Limit(None, 3),
        "10.0.0.1": Limit(1.0, None),
    }


@pytest.mark.parametrize(
    "value",
    [
        "shop.test",  # no limits
        "shop.test=",  # empty limits
        "shop.test=rate=2",  # '=' instead of ':'
        "shop.test=speed:2",  # unknown limit
        "shop.test=rate:fast",  # not a number
        "shop.test=rate:-1",
        "shop.test=rate:nan",
        "shop.test=concurrency:2.5",  # not a whole number
        "shop.test=rate:1/rate:2",  # twice in one entry
        "shop.test=rate:1,shop.test=rate:2",
        "https://shop.test=rate:1",  # a URL, not a host
        "shop.test:8080=rate:1",
        "=rate:1",
    ],
)
def test_malformed_overrides_name_the_setting(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^POLITENESS_OVERRIDES: "):
        parse_overrides(value)


def test_most_specific_override_wins_and_shares_its_budget() -> None:
    policy = read_policy(
        Settings(
            {
                "POLITENESS_RATE": "5",
                "POLITENESS_CONCURRENCY": "8",
                "POLITENESS_OVERRIDES": "example.com=rate:2,api.example.com=concurrency:1/rate:0",
            }
        )
    )
    assert policy.for_host("example.com") == DomainLimit("example.com", 2.0, 8)
    # Subdomains count against the override's domain; the other limit stays the default.
    assert policy.for_host("www.example.com") == DomainLimit("example.com", 2.0, 8)
    assert policy.for_host("WWW.Example.COM.") == DomainLimit("example.com", 2.0, 8)
    # rate:0 lifts the default rate: the site takes anything, with no slow start either.
    assert policy.for_host("v2.api.example.com") == DomainLimit("api.example.com", 0.0, 1, unlimited=True)
    # Not a subdomain, just a similar name: its own host, the defaults.
    assert policy.for_host("badexample.com") == DomainLimit("badexample.com", 5.0, 8)
    assert policy.max_wait == 60.0


def test_spider_attribute_is_the_default_and_overrides_win() -> None:
    spider = SimpleNamespace(name="shop", politeness={"rate": 1})
    policy = read_policy(Settings({"POLITENESS_CONCURRENCY": "3", "POLITENESS_OVERRIDES": "fast.test=rate:10"}), spider)
    assert policy.for_host("other.test") == DomainLimit("other.test", 1.0, 3)
    assert policy.for_host("fast.test") == DomainLimit("fast.test", 10.0, 3)
    with pytest.raises(ConfigError, match=r"^shop\.politeness: "):
        read_policy(Settings(), SimpleNamespace(name="shop", politeness={"rate": "lots"}))


def test_no_limit_configured_means_nothing_to_do() -> None:
    assert not read_policy(Settings({"POLITENESS_RATE": "0", "POLITENESS_OVERRIDES": ""})).limits_anything
    assert read_policy(Settings({"POLITENESS_OVERRIDES": "a.test=concurrency:1"})).limits_anything
    with pytest.raises(ConfigError, match=r"^POLITENESS_MAX_WAIT: "):
        read_policy(Settings({"POLITENESS_RATE": "1", "POLITENESS_MAX_WAIT": "0"}))


@pytest.mark.parametrize(
    "name, value",
    [
        ("POLITENESS_SLOW_START_RATE", "-1"),
        ("POLITENESS_SLOW_START_RATE", "inf"),
        ("POLITENESS_SLOW_START_RATE", "slow"),
        ("POLITENESS_SLOW_START_GROWTH", "1"),  # a ramp that never grows: the site would stay slow
        ("POLITENESS_SLOW_START_GROWTH", "0.5"),
        ("POLITENESS_SLOW_START_GROWTH", "inf"),
        ("POLITENESS_SLOW_START_GROWTH", "double"),
    ],
)
def test_bad_slow_start_settings_name_the_setting(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{name}: "):
        read_policy(Settings({name: value}))


def test_slow_start_defaults_and_switches() -> None:
    conf = read_policy(Settings()).adaptive
    assert (conf.slow_start_rate, conf.slow_start_growth) == (4.0, 2.0)
    # From 4 requests/s, doubled each second, to the top: under 8 s.
    assert 7.9 < slow_start.duration(4.0, 2.0) < 8.0
    assert slow_start.rate_at(4.0, 2.0, 2.0) == 16.0 and slow_start.rate_at(4.0, 2.0, 60) == slow_start.TOP
    assert slow_start.duration(0.0, 2.0) == 0.0  # POLITENESS_SLOW_START_RATE=0: full speed at once


def test_bad_override_fails_scrapy_crawl_by_name(services) -> None:
    env = crawl_env(services, POLITENESS_OVERRIDES="shop.test=rate:2;concurrency:4")
    line = check_one_line_error(run_scrapy(env, "crawl", "demo"), "POLITENESS_OVERRIDES")
    assert "shop.test" in line
    env = crawl_env(services, POLITENESS_RATE="fast")
    check_one_line_error(run_scrapy(env, "crawl", "demo"), "POLITENESS_RATE")
    env = crawl_env(services, POLITENESS_SLOW_START_GROWTH="1")
    check_one_line_error(run_scrapy(env, "crawl", "demo"), "POLITENESS_SLOW_START_GROWTH")


# -- the demo site's arrival log ---------------------------------------------------------------


def test_demo_site_logs_arrivals_and_concurrency() -> None:
    with DemoSite(Catalog(products=5), delay_ms=300) as site:
        before = time.monotonic()
        threads = [
            threading.Thread(target=lambda: urllib.request.urlopen(site.url, timeout=10).read()) for _ in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        arrivals = site.arrivals()
        assert len(arrivals) == site.stats()["total"] == 3
        assert all(before <= a <= time.monotonic() for a in arrivals)
        assert site.max_in_flight() == 3  # each is served for 300 ms: they overlapped
        # A client has its whole answer a moment before the server is done with the request.
        deadline = time.monotonic() + 5
        while site.in_flight() and time.monotonic() < deadline:
            time.sleep(0.01)
        site.reset_stats()
        assert site.arrivals() == [] and site.max_in_flight() == 0


# -- the Lua scripts against real Redis --------------------------------------------------------


def run(server, command: limiter.Command):
    pipe = server.pipeline(transaction=False)
    command.add(pipe)
    return pipe.execute()[0]


def test_rate_reservations_are_spaced_and_capped(clean) -> None:
    r = clean.redis()
    waits = [limiter.parse_reservation(run(r, limiter.reserve("a.test", 10, 0.25))) for _ in range(4)]
    assert [w.reserved for w in waits] == [True, True, True, False]
    # 0.1 s apart, less the time the calls themselves took.
    for i, w in enumerate(waits):
        assert i * 0.1 - 0.05 <= w.wait <= i * 0.1 + 0.001, waits
    # Another domain has a budget of its own; the key forgets itself.
    assert limiter.parse_reservation(run(r, limiter.reserve("b.test", 10, 0.25))).wait == 0
    assert 0 < r.pttl("politeness:{a.test}:next") <= 1400


def test_slow_start_is_one_ramp_for_the_fleet(clean) -> None:
    r = clean.redis()

    def turn(first: float = 10.0, max_wait: float = 1.0) -> tuple[bool, float, float]:
        return slow_start.parse_reply(run(r, slow_start.reserve("a.test", first, 2.0, max_wait)))

    # The first call begins the ramp: turns at 10 requests/s at first, whoever books them (each
    # call may as well come from another node), a little closer as the ramp grows.
    turns = [turn() for _ in range(4)]
    assert [t[0] for t in turns] == [True] * 4
    waits = [t[1] for t in turns]
    gaps = [b - a for a, b in zip(waits, waits[1:])]
    assert waits[0] == 0 and all(0.07 <= g <= 0.1 for g in gaps), waits
    assert gaps[0] > gaps[-1], gaps
    assert all(0 <= t[2] < 0.05 for t in turns), turns
    # The ramp is remembered while the site is crawled, forgotten once it is left alone.
    assert slow_start.RESTART_IDLE * 1000 - 1000 < r.pttl(start_key("a.test")) <= slow_start.RESTART_IDLE * 1000
    # Past the caller's max wait no turn is booked; a node that asks with another first rate
    # (a setting of its own) still joins the fleet's ramp, begun when it began.
    assert not turn(max_wait=0.1)[0]
    assert turn(first=1000)[2] < 0.1

    # Three seconds in, 10 requests/s have doubled three times: turns 1/80 s apart.
    seconds, micros = r.time()
    r.set(start_key("a.test"), seconds * 1_000_000 + micros - 3_000_000)
    r.delete("politeness:{a.test}:next")
    first, second = turn(), turn()
    assert 3.0 <= first[2] < 3.1
    assert 1 / 80 - 0.005 <= second[1] - first[1] <= 1 / 80, (first, second)
    # A ramp that reached the top no longer spaces anything a site would notice.
    r.set(start_key("a.test"), seconds * 1_000_000 + micros - 60_000_000)
    r.delete("politeness:{a.test}:next")
    first, second = turn(), turn()
    assert second[1] - first[1] <= 1 / slow_start.TOP
    assert first[2] > slow_start.duration(10.0, 2.0)


def test_a_first_cut_counts_the_nodes_that_only_heard_of_it(clean) -> None:
    r = clean.redis()

    def cut(node: str, observed: float, join: bool = False) -> float:
        return float(run(r, adaptive.cut("a.test", observed, 0.7, 0.1, 0.0, node, join, hold=0.3)))

    # Nothing under way: joining cuts nothing and makes no rate.
    assert cut("b", 10, join=True) == 0 and not r.hexists(adaptive.ADAPTIVE_KEY, "a.test")
    # Node a saw the 429 and was getting 10 answers a second; node b, which saw none, was
    # getting 12: the site was taking 22 from the fleet, and the rate starts from that.
    assert cut("a", 10) == pytest.approx(7.0)
    assert cut("b", 12, join=True) == pytest.approx(15.4)
    assert cut("b", 12, join=True) == pytest.approx(15.4)  # once per node
    time.sleep(0.35)
    # Past the hold, joining changes nothing (a late report is no throttle answer).
    assert cut("c", 30, join=True) == pytest.approx(15.4)
    assert cut("a", 10) == pytest.approx(15.4 * 0.7)  # a throttle answer still cuts


def test_retry_after_pauses_the_domain_for_every_reservation(clean) -> None:
    r = clean.redis()
    assert run(r, limiter.pause("a.test", 0.5)) == 1
    assert run(r, limiter.pause("a.test", 0.1)) == 0  # a shorter pause never cuts a longer one
    held = limiter.parse_reservation(run(r, limiter.reserve("a.test", 100, 2.0)))
    assert held.reserved and 0.4 <= held.wait <= 0.5, held
    # Past the caller's max wait the turn is not booked; another domain is not held.
    assert not limiter.parse_reservation(run(r, limiter.reserve("a.test", 100, 0.2))).reserved
    assert limiter.parse_reservation(run(r, limiter.reserve("b.test", 100, 2.0))).wait == 0
    assert 0 < r.pttl("politeness:{a.test}:paused") <= 1500


@pytest.mark.parametrize(
    "value, expected",
    [
        (b"2", 2.0),
        (b" 1.5 ", 1.5),
        (b"0", None),
        (b"-3", None),
        (b"soon", None),
        (None, None),
        (b"99999", middleware.RETRY_AFTER_MAX),
        (b"Wed, 21 Oct 2015 07:28:00 GMT", None),
    ],
)
def test_retry_after_is_read_as_seconds(value, expected) -> None:
    assert middleware.retry_after_seconds(value) == expected


def test_a_dead_holder_frees_its_slot_after_its_deadline(clean) -> None:
    r = clean.redis()

    def acquire(token: str, holder_ttl: float = 0.3, waiter_ttl: float = 5.0) -> limiter.Admission:
        return limiter.parse_admission(run(r, limiter.acquire("a.test", token, 1, holder_ttl, waiter_ttl)))

    assert acquire("dead").admitted  # a worker takes the slot, then is killed: no release, ever
    assert acquire("live") == limiter.Admission(False, 0)
    time.sleep(0.4)
    assert acquire("live").admitted  # the dead holder is ignored once its deadline passed
    assert r.zrange(inflight_key("a.test"), 0, -1) == [b"live"]


def test_renewal_keeps_a_slot_and_waiters_go_in_order(clean) -> None:
    r = clean.redis()

    def acquire(token: str, waiter_ttl: float = 5.0) -> limiter.Admission:
        return limiter.parse_admission(run(r, limiter.acquire("a.test", token, 1, 0.3, waiter_ttl)))

    assert acquire("holder").admitted
    assert acquire("dies", waiter_ttl=0.2) == limiter.Admission(False, 0)  # then stops asking
    assert acquire("second") == limiter.Admission(False, 1)
    for _ in range(3):  # renewed past its own 0.3 s deadline
        time.sleep(0.15)
        assert run(r, limiter.renew("a.test", ["holder", "gone"], 0.3)) == 1
    # Still held; the waiter that stopped asking lost its place instead of blocking the rest.
    assert acquire("second") == limiter.Admission(False, 0)
    r.zrem(inflight_key("a.test"), "holder")
    # The slot is free, but "second" asked first: "late" waits for its turn.
    assert acquire("late") == limiter.Admission(False, 1)
    assert acquire("second").admitted
    assert acquire("late") == limiter.Admission(False, 0)
    assert r.zrange(waiting_key("a.test"), 0, -1) == [b"late"]


# -- whole crawls: two processes, one limit ----------------------------------------------------


def valid_rows(clean, catalog: Catalog) -> None:
    rows = clean.query("SELECT sku, count(*) FROM products GROUP BY sku")
    assert all(n == 1 for _, n in rows)
    assert {sku for sku, _ in rows} == {p.sku for p in catalog.valid_products()}


def finished(procs) -> list[str]:
    logs = [p.communicate(timeout=150)[1] for p in procs]
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        assert "Spider closed (finished)" in log, log[-3000:]
    return logs


def test_two_processes_share_one_rate(clean) -> None:
    rate = 5
    catalog = Catalog(products=40)  # 53 pages and 2 robots.txt: ~11 s at 5 requests/s
    with DemoSite(catalog) as site:
        # Few requests per process, so the shared queue keeps work for both of them. Eight
        # requests waiting book turns 1.6 s ahead: past POLITENESS_MAX_WAIT, so some wait for room.
        env = crawl_env(
            clean,
            DEMO_SITE_URL=site.url,
            POLITENESS_RATE=str(rate),
            CONCURRENT_REQUESTS="4",
            POLITENESS_MAX_WAIT="1",
            SCHEDULER_IDLE_TIMEOUT="3",
        )
        logs = finished([start_crawl(env) for _ in range(2)])
        arrivals = sorted(site.arrivals())
        counts = site.stats()["requests"]
    assert sorted(p for p in counts if p != "/robots.txt") == sorted(catalog.pages())
    valid_rows(clean, catalog)
    for log in logs:  # the fleet had two members: each fetched pages, and each was held back
        assert stat(log, "response_received_count") >= 5, log[-3000:]
        assert stat(log, "politeness/waited") > 0, log[-3000:]
    assert any("asks 127.0.0.1 for more than its rate of 5 requests/s" in log for log in logs)

    # n requests paced exactly at the rate span (n - 1) / rate seconds (n / span would read above
    # the rate for a perfect schedule). A little slack: the first request's own latency may
    # shorten the measured span.
    span = arrivals[-1] - arrivals[0]
    assert (len(arrivals) - 1) / span <= rate * 1.03, (len(arrivals), span)
    # Turns are 1/rate apart by the Redis clock, so any 1-second window [t, t+1) holds `rate` of
    # them; a request that leaves its process late (a busy reactor on 2 shared cores) moves a
    # window's start later and lets it reach turns beyond: one more per 1/rate of lateness. Up
    # to 0.4 s late is allowed (7 in a window was seen once in CI's full suite, never alone);
    # the span above holds the rate itself. Without the limit a window holds dozens.
    busiest = max(bisect.bisect_left(arrivals, t + 1.0) - i for i, t in enumerate(arrivals))
    assert busiest <= rate + round(0.4 * rate), busiest


def test_two_processes_share_one_concurrency_limit(clean) -> None:
    catalog = Catalog(products=30)
    with DemoSite(catalog, delay_ms=100) as site:
        env = crawl_env(
            clean,
            DEMO_SITE_URL=site.url,
            POLITENESS_CONCURRENCY="2",
            CONCURRENT_REQUESTS="8",
            CONCURRENT_REQUESTS_PER_DOMAIN="8",
            SCHEDULER_IDLE_TIMEOUT="2",
        )
        logs = finished([start_crawl(env) for _ in range(2)])
        counts = site.stats()["requests"]
        most = site.max_in_flight()
    assert most <= 2, most
    assert sum(stat(log, "politeness/concurrency_waits") for log in logs) > 0  # the limit was binding
    assert sorted(p for p in counts if p != "/robots.txt") == sorted(catalog.pages())
    valid_rows(clean, catalog)
    # Every slot was given back (deadlines are 30 s away: nothing expired by itself).
    assert clean.redis().zcard(inflight_key("127.0.0.1")) == 0


def test_a_page_fetched_through_the_scraping_api_waits_once(clean) -> None:
    # The API's own calls skip the limiter: here the API is on the site's host, and a call that
    # waited for the slot its own target holds would wait forever.
    catalog = Catalog(products=10)
    with DemoSite(catalog, delay_ms=50) as site, StandIn("politeness-test-key") as api:
        env = api_env(
            clean,
            site.url,
            api,
            key="politeness-test-key",
            POLITENESS_CONCURRENCY="1",
            CONCURRENT_REQUESTS_PER_DOMAIN="4",
        )
        result = run_scrapy(env, "crawl", "demo", timeout=90)
        served = api.stats()
        counts = site.stats()["requests"]
        target = f"{site.host}:{site.port}"
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert stat(result.stderr, "scraping_api/pages") >= len(catalog.pages())
    assert sorted(p for p in counts if p != "/robots.txt") == sorted(catalog.pages())
    assert served["max_concurrent"][target] == 1
    assert clean.redis().zcard(inflight_key("127.0.0.1")) == 0


# A middleware after the limiter that ends downloads in each way Scrapy allows.
CHAIN_SPIDER = """
import scrapy
from scrapy.exceptions import DownloadTimeoutError, IgnoreRequest
from scrapy.http import HtmlResponse
from scraper.politeness.keys import inflight_key
from scraper.backends.redis_client import get_redis
from scraper.settings import DOWNLOADER_MIDDLEWARES

KINDS = ("plain", "respond", "raise", "reissue", "flaky")


class Meddler:
    def __init__(self, crawler):
        self.stats = crawler.stats
        self.redis = get_redis(crawler.settings["REDIS_URL"])

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    def process_request(self, request):
        kind = request.meta.get("kind")
        if kind is None:  # robots.txt
            return None
        self.stats.inc_value(f"meddler/{kind}")
        if "_politeness_token" not in request.meta:
            self.stats.inc_value("meddler/without_slot")
        if self.redis.zcard(inflight_key("127.0.0.1")) > 1:
            self.stats.inc_value("meddler/over_limit")
        if kind == "respond":  # like a cache or a scraping API
            return HtmlResponse(request.url, body=b"<html></html>", request=request)
        if kind == "raise":
            raise IgnoreRequest("meddled")
        if kind == "reissue":  # a Request returned from process_request: no hook is called
            return request.replace(meta={**request.meta, "kind": "plain"}, dont_filter=True)
        if kind == "flaky" and request.meta.get("retry_times", 0) < 2:
            raise DownloadTimeoutError("meddled")  # retried by RetryMiddleware
        return None


class ChainSpider(scrapy.Spider):
    name = "chain"
    # A spider's dict replaces the project's: keep the project's middlewares.
    custom_settings = {"DOWNLOADER_MIDDLEWARES": {**DOWNLOADER_MIDDLEWARES, "chain_spider.Meddler": 730}}

    async def start(self):
        for i in range(4):
            for kind in KINDS:
                yield scrapy.Request(f"{self.settings['DEMO_SITE_URL']}{kind}/{i}", meta={"kind": kind},
                                     callback=self.parse, errback=self.failed)

    def parse(self, response):
        self.crawler.stats.inc_value("chain/done")

    def failed(self, failure):
        self.crawler.stats.inc_value("chain/done")
"""


def test_each_download_takes_one_slot_and_gives_it_back(clean, tmp_path: Path) -> None:
    (tmp_path / "chain_spider.py").write_text(CHAIN_SPIDER)
    with DemoSite(Catalog(products=5)) as site:
        # One slot: a slot not given back would stall the crawl (it is renewed while we live).
        env = crawl_env(
            clean,
            DEMO_SITE_URL=site.url,
            POLITENESS_CONCURRENCY="1",
            SCHEDULER_IDLE_TIMEOUT="1",
            PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}",
        )
        result = run_scrapy(env, "crawl", "chain", "-s", "SPIDER_MODULES=chain_spider", timeout=90)
    log = result.stderr
    assert result.returncode == 0 and "Traceback" not in log, log[-3000:]
    assert stat(log, "chain/done") == 20, log[-3000:]
    assert stat(log, "meddler/flaky") == 12  # 4 requests, 3 attempts each, each attempt paced
    assert stat(log, "meddler/plain") == 8  # 4 plain, 4 reissued
    assert stat(log, "meddler/without_slot") == 0 and stat(log, "meddler/over_limit") == 0
    # Only the reissued requests' slots are given back when the request is garbage collected
    # (or when the copy comes back): for every other way, a hook did it at once.
    assert stat(log, "politeness/released_by_gc") <= 4
    assert clean.redis().zcard(inflight_key("127.0.0.1")) == 0


# -- adaptive rate: a site with a limit it does not announce ------------------------------------


def adaptive_crawl(clean, limit: float, products: int, workers: int, **extra: str):
    catalog = Catalog(products=products)
    with DemoSite(catalog) as site:
        site.limit_rate(limit)
        env = crawl_env(clean, DEMO_SITE_URL=site.url, CONCURRENT_REQUESTS="8", SCHEDULER_IDLE_TIMEOUT="3", **extra)
        started = time.monotonic()
        logs = finished([start_crawl(env) for _ in range(workers)])
        took = time.monotonic() - started
        stats = site.stats()
    return catalog, logs, stats, took


def test_a_hidden_rate_limit_loses_no_page_and_is_found(clean) -> None:
    limit = 20
    catalog, logs, stats, took = adaptive_crawl(clean, limit, products=300, workers=2)
    valid_rows(clean, catalog)  # every page stored: nothing lost to 429s
    pages = len(catalog.pages())
    throttled = stats["throttled"]
    # Nearly all of them answer the requests in flight when the first 429 came (8 per worker):
    # the share shrinks with the crawl's length (bench/run.py --only politeness: 2.2 % of 592).
    assert throttled <= 0.05 * stats["total"], (throttled, stats["total"])
    assert not [log for log in logs if stat(log, "dead_letters/count")], [log[-2000:] for log in logs]
    assert any("throttles the fleet (429/503)" in log for log in logs)
    # The run report says it: in each node's summary, and in the run's figures.
    assert any(
        re.search(
            r"Politeness: [1-9]\d* pages throttled \(429/503\) and tried again \(\d+ retries, 0 given "
            r"up as dead letters\); [\d.]+ s waited for turns; 127\.0\.0\.1 at [\d.]+ requests/s "
            r"\(lowest [\d.]+\)",
            log,
        )
        for log in logs
    ), [log[-2000:] for log in logs]
    runs = run_scrapy(crawl_env(clean), "runs", "demo", "--json")
    row = json.loads(runs.stdout.splitlines()[0])
    assert 0 < row["throttled"] <= throttled and row["dead_letters"] == 0, row
    # The fleet found the limit and kept near it (the start and the end are slower, and CI's two
    # cores are shared with another test file); stuck at a guessed low rate it would be far under.
    assert pages / took >= 0.4 * limit, (pages, took)


def test_a_short_crawl_of_an_undeclared_site_starts_slowly(clean) -> None:
    # Two nodes, nothing declared, ~300 requests to a site that takes 20 a second. At full speed
    # from the first request the fleet sent up to 45 requests in its first second, and 2 to 15 %
    # of such a crawl's requests were answered 429, depending on the run.
    limit = 20
    catalog = Catalog(products=260)  # 300 pages
    with DemoSite(catalog) as site:
        site.limit_rate(limit)
        env = crawl_env(clean, DEMO_SITE_URL=site.url, CONCURRENT_REQUESTS="8", SCHEDULER_IDLE_TIMEOUT="3")
        started = time.monotonic()
        logs = finished([start_crawl(env) for _ in range(2)])
        took = time.monotonic() - started
        stats = site.stats()
        arrivals = sorted(site.arrivals())
    valid_rows(clean, catalog)  # every page stored
    assert not [log for log in logs if stat(log, "dead_letters/count")], [log[-2000:] for log in logs]
    assert stats["throttled"] <= 0.05 * stats["total"], (stats["throttled"], stats["total"])
    # One ramp for the fleet, begun at 4 requests/s: ~6 turns in its first second, both nodes'
    # robots.txt among them (a ramp of each node's own would make ~12; full speed, dozens).
    first_second = bisect.bisect_left(arrivals, arrivals[0] + 1.0)
    assert first_second <= 8, [round(a - arrivals[0], 3) for a in arrivals[:20]]
    assert all(stat(log, "politeness/slow_starts") == 1 for log in logs), [log[-2000:] for log in logs]
    assert took < 60, took


def test_a_declared_rate_at_the_limit_loses_nothing(clean) -> None:
    limit = 20
    catalog, logs, stats, _ = adaptive_crawl(clean, limit, products=60, workers=2, POLITENESS_RATE=str(limit))
    valid_rows(clean, catalog)
    # A declared rate is the site's rate from the first request: no slow start.
    assert not any(stat(log, "politeness/slow_starts") for log in logs), [log[-2000:] for log in logs]
    # Turns 1/rate apart by Redis' clock and spaced where they leave: the hidden 1-second window
    # sees at most the limit, give or take a request that left late (a busy reactor on 2 cores
    # shared with another test file: 0 to 5 of 80 seen); each such 429 is tried again at the
    # lowered rate, and nothing is lost. Undeclared, half the requests are 429s at first.
    assert stats["throttled"] <= max(2, 0.08 * stats["total"]), (stats["throttled"], stats["total"])


def test_a_site_that_never_lets_up_ends_in_throttled_dead_letters(clean) -> None:
    catalog = Catalog(products=5)
    with DemoSite(catalog) as site:
        env = crawl_env(
            clean, DEMO_SITE_URL=site.url, POLITENESS_THROTTLED_MAX_WAIT="2", POLITENESS_ADAPTIVE_MIN_RATE="5"
        )
        site.limit_rate(0.5)  # every request answered 429
        result = run_scrapy(env, "crawl", "demo")
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert stat(result.stderr, "dead_letters/throttled") >= 1, result.stderr[-3000:]
    assert stat(result.stderr, "politeness/throttled_retries") > stat(result.stderr, "dead_letters/throttled")
    # The pages' retry budget was not spent on the throttle: Scrapy retried robots.txt alone (a
    # component's own request, left to it), twice (RETRY_TIMES).
    assert stat(result.stderr, "retry/count") == 2, result.stderr[-3000:]
    assert "Gave up retrying <GET http" in result.stderr and "robots.txt> (failed 3 times)" in result.stderr
    # A run that lost its pages to dead letters is not ok.
    assert re.search(r"FAIL\s+dead_letters\s+expected <= 5%, observed [1-9]\d\.\d%", result.stderr), result.stderr[
        -3000:
    ]
    shown = run_scrapy(env, "dlq", "list", "demo")
    assert "throttled" in shown.stdout, shown.stdout


def test_robots_crawl_delay_is_the_fleets_ceiling_and_requests_arrive_spaced(clean) -> None:
    delay = 0.2  # 5 requests/s for the whole fleet, though the spider declares far more
    catalog = Catalog(products=30)  # 42 pages and 2 robots.txt: ~8 s at 5 requests/s
    with DemoSite(catalog, crawl_delay=delay) as site:
        env = crawl_env(
            clean, DEMO_SITE_URL=site.url, POLITENESS_RATE="50", CONCURRENT_REQUESTS="8", SCHEDULER_IDLE_TIMEOUT="3"
        )
        logs = finished([start_crawl(env) for _ in range(2)])
        arrivals = sorted(site.arrivals())
        counts = site.stats()["requests"]
    assert sorted(p for p in counts if p != "/robots.txt") == sorted(catalog.pages())
    valid_rows(clean, catalog)
    assert all(
        "asks Crawl-delay: 0.2 s: the fleet sends it at most 5 requests/s (under the declared 50)" in log
        for log in logs
    ), [log[-3000:] for log in logs]
    # Each node fetched robots.txt before its first turn: take the arrivals after both did.
    pages = arrivals[2:]
    span = pages[-1] - pages[0]
    assert (len(pages) - 1) / span <= (1 / delay) * 1.05, (len(pages), span)
    # The spacing reaches the site, whatever connections the two processes open: every four
    # consecutive gaps span at least 0.7 of four delays. Measured over a window, not gap by gap:
    # a request that left its process late on CI's busy cores lands close to the next one, but
    # only shifts time between neighbouring gaps (a stall of more than a delay may still shorten
    # the few windows around it); two nodes each keeping their own 5/s would put nearly every
    # window of four gaps in 0.4 s.
    window = 4
    spans = [round(b - a, 3) for a, b in zip(pages, pages[window:])]
    short = [s for s in spans if s < 0.7 * window * delay]
    assert len(short) <= max(3, 0.1 * len(spans)), (short, len(spans))


def test_through_the_api_the_targets_429s_slow_the_target_and_the_providers_do_not(clean) -> None:
    catalog = Catalog(products=40)
    with DemoSite(catalog) as site, StandIn("politeness-test-key") as api:
        # The provider throttles our account three times (its own 429, with Retry-After), and the
        # target site has a limit of its own, which only its own 429s reveal.
        api.configure(rules=[{"status": 429, "count": 3, "after": 5, "retry_after": 1}])
        site.limit_rate(8)
        env = api_env(
            clean,
            site.url,
            api,
            key="politeness-test-key",
            CONCURRENT_REQUESTS="8",
            SCRAPING_API_RETRY_BACKOFF="0.2",
        )
        result = run_scrapy(env, "crawl", "demo", timeout=120)
        target = site.stats()
    log = result.stderr
    assert result.returncode == 0 and "Traceback" not in log, log[-3000:]
    valid_rows(clean, catalog)  # nothing lost to either kind of 429
    assert stat(log, "dead_letters/count") == 0, log[-3000:]
    # The provider's 429s were the API client's to wait out and retry: they are not the site's.
    assert stat(log, "scraping_api/retries/429") == 3, log[-3000:]
    # The site's 429s, passed on by the API as the target's answer, slowed the site down.
    assert target["throttled"] > 0
    assert stat(log, "politeness/throttle_answers") == target["throttled"], (log[-3000:], target)
    rate = float(re.search(r"'politeness/rate/127\.0\.0\.1': ([\d.]+)", log).group(1))
    assert 0.1 <= rate <= 8 * 1.5, rate


def test_a_bot_walls_403_challenge_slows_the_fleet_and_its_pages_wait_as_dead_letters(clean) -> None:
    catalog = Catalog(products=80)
    with DemoSite(catalog) as site:
        site.limit_rate(15, answer=403)  # past 15 requests/s: a captcha page with 403
        env = crawl_env(clean, DEMO_SITE_URL=site.url, CONCURRENT_REQUESTS="8")
        started = time.monotonic()
        result = run_scrapy(env, "crawl", "demo")
        took = time.monotonic() - started
        challenged = site.stats()["throttled"]
        # The wall let up: the blocked pages are queued again, and the next run stores them.
        site.limit_rate(0)
        requeued = run_scrapy(env, "dlq", "requeue", "demo", "--reason", "blocked")
        again = run_scrapy(env, "crawl", "demo")
        site.reset_stats()
        site.limit_rate(0.5, answer=403)
        off = run_scrapy(
            crawl_env(clean, DEMO_SITE_URL=site.url, POLITENESS_BLOCK_PATTERN="off"),
            "crawl",
            "demo",
            "-s",
            "SCHEDULER_FLUSH_ON_START=true",
        )
    log = result.stderr
    assert result.returncode == 0 and "Traceback" not in log, log[-3000:]
    assert challenged > 0 and stat(log, "politeness/challenge_answers") == challenged, (challenged, log[-3000:])
    assert "127.0.0.1 throttles the fleet (429/503)" in log  # the fleet slowed down
    # A wall may never let this client through: its pages are not retried for minutes, they wait
    # as dead letters (robots.txt, a component's own request, is not one).
    assert took < 60, took
    assert challenged - 1 <= stat(log, "dead_letters/blocked") <= challenged, log[-3000:]
    assert requeued.returncode == 0 and "requeued" in requeued.stdout, requeued.stdout + requeued.stderr
    assert again.returncode == 0, again.stderr[-3000:]
    valid_rows(clean, catalog)  # nothing lost: every blocked page stored once the wall let up
    # With the pattern off, a 403 is a 403: no challenge, no slowing down.
    assert not stat(off.stderr, "politeness/challenge_answers"), off.stderr[-3000:]
    assert stat(off.stderr, "downloader/response_status_count/403") >= 1, off.stderr[-3000:]
