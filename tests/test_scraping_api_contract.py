"""The stand-in checked against what we did not write, and pages the API path could garble.

* The providers' official clients (``alterlab``, ``scrapingbee``, ``zyte-api``: test-only
  dependencies) run against the stand-in: if the stand-in drifted from the real contract, the
  official client would no longer understand it.
* A shop whose pages declare ``windows-1252`` only in ``<meta charset>`` stores the same rows
  crawled directly and through every provider.
* A redirected target: links resolve against the URL the target ended at.
* A page the API decoded wrongly is counted and reported, not stored silently.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from support.crawls import Services, crawl_env, project_with_spider, run_scrapy

from scraper.demo_site import Catalog, DemoSite
from scraper.scraping_api.standin import COUNTRY_HEADER, StandIn

KEY = "canary-contract-8d2e6a1f9b"


@contextmanager
def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A local site answering with *handler*, served from a thread; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def api():
    with StandIn(KEY) as running:
        yield running


@pytest.fixture(scope="module")
def shop():
    with DemoSite(Catalog(products=12)) as running:
        yield running


# -- the official clients ----------------------------------------------------------------------


def test_official_alterlab_sdk_understands_the_standin(api: StandIn, shop: DemoSite) -> None:
    from alterlab import AlterLab, AlterLabAPIError, JobExpiredError

    product = shop.catalog.valid_products()[0]
    page = shop.url.rstrip("/") + product.paths[0]

    async def scenario() -> None:
        async with AlterLab(api_key=KEY, base_url=api.url, max_retries=3, retry_delay=0.01) as client:
            result = await client.scrape(
                page,
                cookies={"session": "s1"},
                location={"country": "DE", "language": "de"},
                extraction_profile="product",
                timeout=20,
            )
            assert result["status_code"] == 200 and result["url"] == page and result["final_url"] == page
            assert product.title.split()[0] in result["content"]
            assert result["billing"]["total_credits"] == 200 and result["billing"]["tier_used"] == "1"
            assert result["extraction_result"]["sku"] == product.sku

            api.configure(async_jobs=True, job_ready_polls=2)
            queued = await client.scrape(page, sync=False)
            assert set(queued) >= {"job_id", "status"}
            done = await client.wait_for_job(queued["job_id"], poll_interval=0.01)
            assert done["status_code"] == 200 and done["final_url"] == page
            polled = await client.scrape(page, poll_interval=0.01)  # the SDK polls 202s by itself
            assert polled["status_code"] == 200

            api.configure(expire_jobs=1)
            expired = await client.scrape(page, sync=False)
            with pytest.raises(JobExpiredError):
                await client.wait_for_job(expired["job_id"], poll_interval=0.01)
            api.configure(fail_jobs=1)
            with pytest.raises(AlterLabAPIError, match="Job failed"):
                await client.scrape(page, poll_interval=0.01)
            api.configure(async_jobs=False, rules=[{"status": 429, "count": 1, "retry_after": 0}])
            assert (await client.scrape(page))["status_code"] == 200  # the SDK retried the 429
            api.configure(rules=[{"status": 403, "count": 1}])
            with pytest.raises(AlterLabAPIError) as blocked:
                await client.scrape(page)
            assert blocked.value.status_code == 403

        async with AlterLab(api_key="wrong-key", base_url=api.url, max_retries=1) as wrong:
            with pytest.raises(AlterLabAPIError) as refused:
                await wrong.scrape(page)
            assert refused.value.status_code == 401

    asyncio.run(scenario())
    served = api.stats()
    assert served["unknown_fields"] == {}  # every field the SDK sends is one the stand-in knows
    assert served["bad_keys"] == 1 and served["failed_jobs"] == 1 and served["expired"] == 1


def test_official_scrapingbee_and_zyte_clients_understand_the_standin(api: StandIn, shop: DemoSite) -> None:
    from scrapingbee import ScrapingBeeClient
    from zyte_api import AsyncZyteAPI, RequestError

    page = shop.url.rstrip("/") + shop.catalog.valid_products()[0].paths[0]

    class LocalBee(ScrapingBeeClient):
        HTML_API_URL = f"{api.url}/api/v1/"

    answer = LocalBee(KEY).html_api(page, params={"render_js": False, "transparent_status_code": True})
    assert answer.status_code == 200 and b"<html" in answer.content.lower()
    assert answer.headers["Spb-Cost"] == "1" and answer.headers["Spb-Resolved-Url"] == page
    assert LocalBee("wrong").html_api(page, params={"render_js": False}).status_code == 401
    assert api.stats()["key_in_url"] == 0  # the official client sends it as a Bearer header too

    async def zyte() -> None:
        client = AsyncZyteAPI(api_key=KEY, api_url=f"{api.url}/v1/")
        raw = await client.get(
            {"url": page, "httpResponseBody": True, "httpResponseHeaders": True, "geolocation": "FR"}
        )
        assert raw["statusCode"] == 200 and raw["url"] == page and raw["httpResponseBody"]
        browser = await client.get({"url": page, "browserHtml": True})
        assert "<html" in browser["browserHtml"].lower()
        with pytest.raises(RequestError) as bad:
            await client.get({"url": page, "browserHtml": True, "httpRequestMethod": "POST"})
        assert bad.value.status == 400

    asyncio.run(zyte())
    assert api.stats()["calls"]["zyte"] == 2  # the refused browser POST never reached a fetch


# -- a non-UTF-8 shop, directly and through every provider --------------------------------------


class _Cp1252(BaseHTTPRequestHandler):
    """The demo shop, every page re-encoded to windows-1252 and declared only in <meta charset>;
    ``/moved`` redirects to a page whose links are relative."""

    protocol_version = "HTTP/1.1"
    site: DemoSite
    seen: list[str]

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        type(self).seen.append(self.path)
        if self.path == "/moved":
            self._send(302, b"", [("Location", "/deep/dir/index.html")])
            return
        if self.path.startswith("/deep/dir/"):
            self._send(200, b'<html><body><a href="next.html">next</a></body></html>', [("Content-Type", "text/html")])
            return
        path, _, query = self.path.partition("?")
        page = self.site.page(path, query)
        body = page.body_for(f"http://{self.headers['Host']}")
        if page.content_type.startswith("text/html"):
            charset = (re.search(r"charset=([\w-]+)", page.content_type) or [None, "utf-8"])[1]
            text = body.decode(charset)
            text = re.sub(r"<meta[^>]*charset[^>]*>", '<meta charset="windows-1252">', text, count=1, flags=re.I)
            body = text.encode("cp1252", errors="xmlcharrefreplace")
            ctype = "text/html"  # no charset in the header: only the page says what it is
        else:
            ctype = page.content_type
        self._send(page.status, body, [("Content-Type", ctype), *page.headers])


@pytest.fixture(scope="module")
def cp1252_shop():
    site = DemoSite(Catalog(products=40))
    handler = type("Cp1252Shop", (_Cp1252,), {"site": site, "seen": []})
    with serve(handler) as url:
        yield url, handler


def rows(services: Services) -> list[tuple]:
    return sorted(services.query("SELECT sku, title, description, price, currency FROM products"), key=repr)


def test_a_windows_1252_shop_stores_the_same_rows_directly_and_through_every_provider(
    clean, cp1252_shop, api: StandIn
) -> None:
    url, _handler = cp1252_shop
    base = crawl_env(clean, DEMO_SITE_URL=url, METRICS_ENABLED="false", SCRAPING_API_RETRY_BACKOFF="0.05")
    direct = run_scrapy(base, "crawl", "demo")
    assert direct.returncode == 0, direct.stderr[-3000:]
    expected = rows(clean)
    assert len(expected) > 20
    assert any("€" in (title or "") + (desc or "") for _, title, desc, _, _ in expected) or any(
        cur == "EUR" for *_, cur in expected
    )
    assert not any("\ufffd" in (title or "") + (desc or "") for _, title, desc, _, _ in expected)
    for provider, options in [
        ("alterlab", "{}"),
        ("scrapingbee", "{}"),
        ("zyte", "{}"),
        ("zyte", '{"render_js": true}'),
    ]:
        clean.redis().flushdb()
        clean.query("TRUNCATE products, rejects")
        env = dict(
            base,
            SCRAPING_API_KEY=KEY,
            SCRAPING_API_URL=api.url,
            SCRAPING_API_PROVIDER=provider,
            SCRAPING_API_OPTIONS=options,
        )
        result = run_scrapy(env, "crawl", "demo")
        assert result.returncode == 0, result.stderr[-3000:]
        assert "scraping_api/damaged_text" not in result.stderr
        assert rows(clean) == expected, (provider, options)


def test_links_resolve_against_the_url_the_target_ended_at(clean, cp1252_shop, api: StandIn, tmp_path: Path) -> None:
    url, handler = cp1252_shop
    project = project_with_spider(
        tmp_path,
        "moved",
        f'''
import scrapy


class Moved(scrapy.Spider):
    name = "moved"
    start_urls = ["{url}moved"]
    custom_settings = {{"ITEM_PIPELINES": {{}}}}

    def parse(self, response):
        yield {{"url": response.url}}
        yield response.follow(response.css("a::attr(href)").get(), callback=self.done)

    def done(self, response):
        yield {{"url": response.url}}
''',
    )
    handler.seen.clear()
    env = crawl_env(
        clean, SCRAPING_API_KEY=KEY, SCRAPING_API_URL=api.url, METRICS_ENABLED="false", PYTHONPATH=str(project)
    )
    result = run_scrapy(env, "crawl", "moved", cwd=project)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "/deep/dir/next.html" in handler.seen, handler.seen  # not /next.html
    assert "/next.html" not in handler.seen


def test_text_the_api_garbled_is_counted_and_reported(clean, api: StandIn, tmp_path: Path) -> None:
    class Mislabelled(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            # Declared UTF-8, written in windows-1252: any decoder loses the accents.
            body = "<html><head><meta charset='utf-8'><title>Caf\u00e9 cr\u00e8me</title></head><body>12,50 \u20ac</body></html>"
            raw = body.encode("cp1252")
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    with serve(Mislabelled) as site:
        project = project_with_spider(
            tmp_path,
            "one",
            f'''
import scrapy


class One(scrapy.Spider):
    name = "one"
    start_urls = ["{site}"]
    custom_settings = {{"ITEM_PIPELINES": {{}}, "ROBOTSTXT_OBEY": False}}

    def parse(self, response):
        yield {{"title": response.css("title::text").get()}}
''',
        )
        env = crawl_env(
            clean, SCRAPING_API_KEY=KEY, SCRAPING_API_URL=api.url, METRICS_ENABLED="false", PYTHONPATH=str(project)
        )
        result = run_scrapy(env, "crawl", "one", cwd=project)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "'scraping_api/damaged_text': 1" in result.stderr
    assert "replacement characters (U+FFFD)" in result.stderr
    assert KEY not in result.stderr


def test_geo_cookies_and_content_type_reach_the_target(clean, api: StandIn, tmp_path: Path) -> None:
    seen: list[dict[str, str]] = []

    class Echo(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            seen.append({**dict(self.headers.items()), "_body": self.rfile.read(length).decode()})
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    with serve(Echo) as site:
        site += "form"
        project = project_with_spider(
            tmp_path,
            "form",
            f'''
import scrapy


class Form(scrapy.Spider):
    name = "form"
    custom_settings = {{"ITEM_PIPELINES": {{}}, "ROBOTSTXT_OBEY": False}}
    scraping_api = {{"country": "de", "cookies": {{"consent": "yes"}}}}

    async def start(self):
        yield scrapy.FormRequest("{site}", formdata={{"q": "shoes"}}, dont_filter=True)

    def parse(self, response):
        yield {{"body": response.text}}
''',
        )
        env = crawl_env(
            clean, SCRAPING_API_KEY=KEY, SCRAPING_API_URL=api.url, METRICS_ENABLED="false", PYTHONPATH=str(project)
        )
        result = run_scrapy(env, "crawl", "form", cwd=project)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(seen) == 1, seen
    got = seen[0]
    assert got[COUNTRY_HEADER] == "DE"
    assert got["Cookie"] == "consent=yes"
    assert got["Content-Type"] == "application/x-www-form-urlencoded" and got["_body"] == "q=shoes"


# -- structured extraction -----------------------------------------------------------------------


def test_api_extract_spider_stores_a_shops_products_with_no_selectors(clean, api: StandIn) -> None:
    with DemoSite(Catalog(products=40)) as site:
        direct = run_scrapy(crawl_env(clean, DEMO_SITE_URL=site.url, METRICS_ENABLED="false"), "crawl", "demo")
        assert direct.returncode == 0, direct.stderr[-3000:]
        by_selectors = sorted(clean.query("SELECT sku, title, price, currency FROM products"))
        assert len(by_selectors) == len(site.catalog.valid_products())
        for args in (["-a", "profile=product"], []):  # a profile, then the schema of ProductItem
            clean.redis().flushdb()
            clean.query("TRUNCATE products, rejects")
            env = crawl_env(clean, SCRAPING_API_KEY=KEY, SCRAPING_API_URL=api.url, METRICS_ENABLED="false")
            result = run_scrapy(env, "crawl", "api_extract", "-a", f"url={site.url}", *args)
            assert result.returncode == 0, result.stderr[-3000:]
            assert sorted(clean.query("SELECT sku, title, price, currency FROM products")) == by_selectors, args
            served = api.stats()
            assert re.search(rf"'scraping_api/credits': {served['credits']:.0f}\b", result.stderr)
            assert served["unknown_fields"] == {}
            api.reset()
    no_key = run_scrapy(
        crawl_env(clean, METRICS_ENABLED="false"), "crawl", "api_extract", "-a", "url=http://127.0.0.1:9/"
    )
    assert no_key.returncode == 2 and "Traceback" not in no_key.stderr
    assert (
        no_key.stderr.strip()
        .splitlines()[-1]
        .startswith("error: SCRAPING_API_KEY: api_extract has the scraping API extract")
    ), no_key.stderr
