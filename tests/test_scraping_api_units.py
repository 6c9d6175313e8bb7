"""The scraping-API pieces on their own: providers' wire formats, routing, budget, settings, and
the stand-in started as its own process (``python -m scraper.scraping_api.standin``)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from urllib.parse import parse_qs, urlsplit

import pytest
from scrapy.http import Headers
from scrapy.settings import Settings
from support.crawls import ROOT

from scraper.config import ConfigError
from scraper.demo_site import Catalog, DemoSite
from scraper.scraping_api.budget import Budget
from scraper.scraping_api.middleware import get_settings, merge_options
from scraper.scraping_api.providers import (
    AlterLab,
    ApiError,
    Expired,
    Failed,
    Job,
    OptionError,
    Result,
    ScrapingBee,
    Target,
    Zyte,
    retry_after_seconds,
)
from scraper.scraping_api.routing import parse_routing, route_for

KEY = "unit-canary-5e1b9d"


def test_alterlab_request_and_answers() -> None:
    p = AlterLab(KEY, "http://api.test/")
    call = p.build_request(
        Target("http://shop.test/a"), {"render_js": True, "country": "de", "wait_for": "#x", "wait_until": "load"}, 54
    )
    assert (call.url, call.method, call.headers["X-API-Key"]) == ("http://api.test/api/v1/scrape", "POST", KEY)
    body = json.loads(call.body)
    assert body["url"] == "http://shop.test/a" and body["formats"] == ["html"] and body["wait_for"] == "#x"
    assert body["wait_until"] == "load" and body["timeout"] == 54  # server-side, below ours
    assert body["advanced"] == {"render_js": True}
    assert body["location"] == {"country": "DE"}  # the documented geo option, not a paid proxy flag
    assert KEY not in call.body.decode() and KEY not in repr(p) and KEY not in repr(call)
    post = json.loads(
        p.build_request(Target("http://shop.test/f", "POST", {"Content-Type": "a/b"}, b"q=1"), {}, 30).body
    )
    assert (post["method"], post["body"], post["headers"], post["content_type"]) == (
        "POST",
        "q=1",
        {"Content-Type": "a/b"},
        "a/b",
    )
    with pytest.raises(OptionError, match="unknown alterlab option.*wiat_for"):
        p.check_options({"wiat_for": "#x"})
    p.check_options(
        {"force_refresh": True, "remove_cookie_banners": True, "scroll_count": 3, "extraction_profile": "product"}
    )

    ok = p.parse_response(
        200,
        Headers(),
        json.dumps(
            {
                "url": "http://shop.test/a",
                "final_url": "http://shop.test/a/",
                "status_code": 404,
                "content": "<p>é</p>",
                "billing": {"total_credits": 1200, "tier_used": "4"},
                "credits_used": 5,
                "headers": {
                    "Content-Type": "text/html; charset=iso-8859-1",
                    "Content-Encoding": "gzip",
                    "Set-Cookie": ["a=1", "b=2"],
                },
            }
        ).encode(),
    )
    assert isinstance(ok, Result) and (ok.status, ok.url, ok.credits) == (404, "http://shop.test/a/", 1200)
    assert ok.body == "<p>é</p>".encode() and ("Content-Type", "text/html; charset=utf-8") in ok.headers
    assert [k for k, _ in ok.headers].count("Set-Cookie") == 2 and "Content-Encoding" not in dict(ok.headers)
    assert p.parse_response(202, Headers(), b'{"job_id": "j1"}') == Job("j1")
    limited = p.parse_response(429, Headers({"Retry-After": "7"}), b'{"error": "RATE_LIMITED", "message": "slow down"}')
    assert limited == ApiError(429, "slow down", 7.0, "RATE_LIMITED", "retry") and limited.retryable
    assert p.parse_response(401, Headers(), b'{"error": "UNAUTHORIZED", "message": "bad key"}').kind == "auth"
    blocked = p.parse_response(403, Headers(), b'{"error": "BLOCKED_BY_ANTIBOT", "message": "blocked"}')
    assert blocked.kind == "blocked" and blocked.reason == "api:403:BLOCKED_BY_ANTIBOT"
    assert (
        p.parse_response(402, Headers(), b'{"error": "INSUFFICIENT_CREDITS", "message": "balance"}').kind == "credits"
    )
    assert p.parse_response(402, Headers(), b'{"error": "PAYWALL_DETECTED", "message": "paywall"}').kind == "fatal"
    assert p.parse_response(504, Headers(), b'{"error": "TIMEOUT", "message": "t"}').kind == "retry"  # refunded
    assert p.parse_response(504, Headers(), b"<html>gateway</html>").kind == "fatal"  # may have been billed
    assert p.parse_response(503, Headers(), b"<html>oops</html>").retryable
    assert p.parse_response(404, Headers(), b'{"detail": "Not Found"}').reason == "api:404:http_404"
    assert p.poll_request("j1").url == "http://api.test/api/v1/jobs/j1"
    assert p.parse_poll(404, Headers(), b'{"detail": "gone"}', "j1") == Expired("j1")
    assert p.parse_poll(200, Headers(), b'{"status": "pending"}', "j1") == Job("j1")
    assert p.parse_poll(200, Headers(), b'{"status": "failed", "error": "tiers"}', "j1") == Failed("j1", "tiers")
    done = p.parse_poll(
        200,
        Headers(),
        json.dumps(
            {
                "status": "completed",
                "result": {
                    "url": "http://shop.test/a",
                    "status_code": 200,
                    "content": "x",
                    "billing": {"total_credits": 200},
                    "extraction_result": {"name": "N"},
                },
            }
        ).encode(),
        "j1",
    )
    assert isinstance(done, Result) and done.body == b"x" and done.extraction == {"name": "N"}


def test_scrapingbee_and_zyte_wire_formats() -> None:
    bee = ScrapingBee(KEY)
    call = bee.build_request(Target("http://shop.test/a?b=1"), {"render_js": False, "country": "US"}, 50)
    query = parse_qs(urlsplit(call.url).query)
    assert call.url.startswith("https://app.scrapingbee.com/api/v1/?")
    assert query["url"] == ["http://shop.test/a?b=1"] and query["country_code"] == ["us"]
    assert query["transparent_status_code"] == ["true"] and query["timeout"] == ["50000"]
    assert KEY not in call.url and call.headers["Authorization"] == f"Bearer {KEY}"  # never in a URL
    page = bee.parse_response(
        403,
        Headers(
            {
                "Spb-Cost": "10",
                "Spb-Resolved-Url": "http://shop.test/a",
                "Spb-Set-Cookie": "a=1",
                "Content-Type": "text/html",
            }
        ),
        b"<p>no</p>",
    )
    assert isinstance(page, Result) and (page.status, page.credits, page.body) == (403, 10.0, b"<p>no</p>")
    assert ("Set-Cookie", "a=1") in page.headers
    assert bee.parse_response(401, Headers(), b'{"message": "Invalid api key"}').kind == "auth"
    assert bee.parse_response(401, Headers(), b'{"message": "Monthly API calls limit reached: 1000"}').kind == "credits"

    zyte = Zyte(KEY)
    call = zyte.build_request(Target("http://shop.test/a", "POST", {}, b"\x00\x01"), {"country": "fr"}, 50)
    body = json.loads(call.body)
    assert call.url == "https://api.zyte.com/v1/extract"
    assert call.headers["Authorization"] == "Basic " + base64.b64encode(f"{KEY}:".encode()).decode()
    assert body["httpRequestBody"] == "AAE=" and body["geolocation"] == "FR" and body["httpResponseBody"] is True
    browser = json.loads(
        zyte.build_request(
            Target("http://shop.test/a", "GET", {"Referer": "http://shop.test/", "X-Mine": "1"}),
            {"render_js": True},
            50,
        ).body
    )
    assert browser["browserHtml"] is True and "customHttpRequestHeaders" not in browser
    assert browser["requestHeaders"] == {"referer": "http://shop.test/"}
    with pytest.raises(OptionError, match="browser requests"):
        zyte.build_request(Target("http://shop.test/f", "POST", {}, b"q=1"), {"render_js": True}, 50)
    page = zyte.parse_response(
        200,
        Headers(),
        json.dumps(
            {
                "url": "http://shop.test/a",
                "statusCode": 500,
                "httpResponseBody": base64.b64encode(b"raw").decode(),
                "httpResponseHeaders": [{"name": "Content-Type", "value": "text/plain"}],
            }
        ).encode(),
    )
    assert isinstance(page, Result) and (page.status, page.body, page.decoded) == (500, b"raw", False)
    assert zyte.parse_response(520, Headers(), b'{"type": "/download/temporary-error"}').retryable
    throttled = zyte.parse_response(429, Headers(), b'{"type": "/limits/over-user-limit"}')
    assert throttled.kind == "throttled" and 20 <= zyte.retry_delay(throttled, 0, 1.0) <= 40
    assert zyte.max_attempts(zyte.parse_response(521, Headers(), b"{}")) == 2


def test_routing_budget_options_and_settings() -> None:
    rules = parse_routing("example.com=always, shop.test=on_block,api.shop.test=never")
    assert route_for("www.example.com", rules, "never") == "always"
    assert route_for("shop.test", rules, "always") == "on_block"
    assert route_for("api.shop.test", rules, "always") == "never"
    assert route_for("other.org", rules, "on_block") == "on_block"
    with pytest.raises(ConfigError, match="^SCRAPING_API_ROUTING: route for a.com must be one of"):
        parse_routing("a.com=sometimes")
    with pytest.raises(ConfigError, match="^SCRAPING_API_ROUTING: expected domain=route"):
        parse_routing("a.com")

    budget = Budget(10)
    held = [budget.reserve(3) for _ in range(3)]
    assert all(held) and budget.reserve(3) is None  # 9 reserved
    budget.settle(held[0], 3)
    assert budget.reserve(1) and budget.reserve(1) is None  # 3 spent + 7 reserved = 10
    assert Budget(0).reserve(1e9)  # no budget

    assert merge_options({"render_js": False, "a": 1}, {"render_js": True}, {"country": "de"}) == {
        "render_js": True,
        "a": 1,
        "country": "de",
    }
    assert merge_options({"render_js": False}, None, {"render_js": True})["render_js"] is True

    conf = get_settings(Settings({"SCRAPING_API_KEY": KEY, "SCRAPING_API_OPTIONS": '{"render_js": true}'}))
    assert conf["base_url"] == "https://api.alterlab.io" and conf["options"] == {"render_js": True}
    for name, value in [
        ("SCRAPING_API_PROVIDER", "nope"),
        ("SCRAPING_API_BUDGET", "lots"),
        ("SCRAPING_API_URL", "ftp://x"),
        ("SCRAPING_API_DEFAULT_ROUTE", "maybe"),
        ("SCRAPING_API_MAX_RETRIES", "-1"),
        ("SCRAPING_API_OPTIONS", '{"redner_js": true}'),
        ("SCRAPING_API_OPTIONS", "[1]"),
        ("SCRAPING_API_BLOCKED_ESCALATION", '[{"nope": 1}]'),
        ("SCRAPING_API_ROBOTSTXT", "sometimes"),
    ]:
        with pytest.raises(ConfigError, match=f"^{name}: "):
            get_settings(Settings({"SCRAPING_API_KEY": KEY, name: value}))
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert retry_after_seconds(b"2.5") == 2.5 and retry_after_seconds("soon") is None


def _call(url: str, key: str | None, payload: dict | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["X-API-Key"] = key
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_standin_runs_as_its_own_process() -> None:
    env = {**os.environ, "SCRAPING_API_STANDIN_KEY": KEY, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "scraper.scraping_api.standin", "--port", "0", "--fail", "429x1", "--retry-after", "3"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, proc.stderr.read() if proc.poll() is not None else line
        base = line.rsplit(" ", 1)[-1].strip()
        with DemoSite(Catalog(products=5)) as site:
            assert _call(f"{base}/api/v1/scrape", "wrong", {"url": site.url}) == (
                401,
                {"error": "UNAUTHORIZED", "message": "Invalid or missing API key", "details": {}},
            )
            status, body = _call(f"{base}/api/v1/scrape", KEY, {"url": site.url})
            assert (status, body["error"], body["message"]) == (429, "RATE_LIMITED", "stand-in rule: 429")
            status, body = _call(f"{base}/api/v1/scrape", KEY, {"url": site.url, "advanced": {"render_js": True}})
            assert (status, body["status_code"], body["billing"]["total_credits"]) == (200, 200, 1000)
            assert "<html" in body["content"].lower()
            assert _call(f"{base}/api/v1/scrape", KEY, {"url": "http://example.com/"})[0] == 400
            assert _call(f"{base}/api/v1/jobs/nope", KEY)[0] == 404
            stats = _call(f"{base}/_admin/stats", None)[1]
            assert stats["credits"] == 1000 and stats["bad_keys"] == 1
    finally:
        proc.terminate()
        proc.wait(timeout=10)
