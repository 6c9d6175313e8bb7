"""Rendering in a real Chromium (Debian's, located by `make tools`), inside the same walls.

* The demo shop's JavaScript-only section, crawled by two nodes while one node's browser is
  killed: every product stored once, every product page fetched once, each page archived as a
  rendered record, no dead letter.
* A page whose scripts reach for another loopback port, a second loopback address, an internal
  name and the cloud metadata address, in every way a page can ask (fetch, XHR, script, style,
  image, frame, beacon, event stream, WebSocket, popup, preconnect, WebRTC, a redirect from its own
  site): listeners count every connection, and each stays at 0.
* A bad ``RENDER_*`` setting or ``render`` spec fails at start, by name; a crawl that renders
  nothing never imports Playwright.
"""

from __future__ import annotations

import gzip
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
from support.binaries import ensure_binary
from support.crawls import ROOT, crawl_env, project_with_spider, run_scrapy
from support.errors import check_one_line_error
from support.processes import start_crawl, wait_for
from support.stats import stat_value

from scraper.demo_site import Catalog, DemoSite

CHROMIUM = "/usr/bin/chromium"


def chromium() -> str:
    path = ensure_binary("chromium", "chromium")
    assert os.path.realpath(path) == os.path.realpath(CHROMIUM), f"RENDER_BROWSER expects {CHROMIUM}, found {path}"
    return path


def browser_of(crawl_pid: int) -> psutil.Process | None:
    """The main Chromium process a crawl started (its renderers carry --type=...)."""
    try:
        children = psutil.Process(crawl_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for child in children:
        try:
            line = child.cmdline()
        except psutil.Error:
            continue
        if (
            line
            and os.path.basename(line[0]) in ("chromium", "chrome")
            and not any(a.startswith("--type") for a in line)
        ):
            return child
    return None


def test_a_js_only_section_crawled_by_two_nodes_one_browser_killed_stores_each_product_once(clean, tmp_path) -> None:
    chromium()
    with DemoSite(Catalog(products=60)) as site:
        env = crawl_env(
            clean,
            DEMO_SITE_URL=site.url,
            FETCH_ALLOW_NETWORKS="127.0.0.1/32",
            ARCHIVE_ENABLED="true",
            ARCHIVE_URL=str(tmp_path / "warc"),
            RENDER_CONTEXT_PAGES="10",  # several contexts recycled within the crawl
        )
        first, second = start_crawl(env, spider="demo_js"), start_crawl(env, spider="demo_js")

        def products_fetched() -> int:
            return sum(n for path, n in site.stats()["requests"].items() if path.startswith("/js/p/"))

        try:
            wait_for(lambda: products_fetched() >= 10, timeout=60, step=0.05)
            browser = wait_for(lambda: browser_of(first.proc.pid), timeout=30, step=0.05)
            # Killed once it has been rendering for a while (the node that joins starts later).
            wait_for(lambda: time.time() - browser.create_time() > 2, timeout=10, step=0.05)
            killed = (browser.pid, browser.cmdline()[:3])
            os.kill(browser.pid, signal.SIGKILL)  # the browser of a node dies mid-crawl
            logs = [crawl.communicate(timeout=120)[1] for crawl in (first, second)]
        finally:
            for crawl in (first, second):
                if crawl.proc.poll() is None:
                    crawl.proc.kill()
        requests = site.stats()["requests"]
        skus = site.js.skus()
        ids = [p.id for p in site.js.products]
    for crawl, log in zip((first, second), logs):
        assert crawl.returncode == 0, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
    # The killed browser was started again and the node went on rendering.
    assert stat_value(logs[0], "render/browser_starts") >= 2, (killed, logs[0][-3000:])
    rows = clean.query("SELECT sku, count(*) FROM products GROUP BY sku")
    assert {sku for sku, _ in rows} == skus and all(n == 1 for _, n in rows), rows
    # Every product page was fetched once by the fleet (a crashed render is redone from the
    # downloaded page, not fetched again); every tenth product's error box was rendered again.
    assert {f"/js/p/{i}.html": requests.get(f"/js/p/{i}.html") for i in ids} == {f"/js/p/{i}.html": 1 for i in ids}
    assert sum(stat_value(log, "render/error_retries") or 0 for log in logs) >= len([i for i in ids if i % 10 == 0])
    assert requests.get("/js/api/products?offset=20&limit=20", 0) >= 1  # "Load more" was clicked
    assert clean.redis().llen("{demo_js}:dead") == 0
    # Each page is archived as what the spider saw, marked rendered: the products are in the records.
    archived = clean.query("SELECT via, count(DISTINCT fingerprint) FROM archive_index GROUP BY via")
    assert dict(archived) == {"rendered": len(ids) + 2}, archived
    records = b"".join(gzip.open(f).read() for f in Path(tmp_path / "warc").rglob("*.warc.gz"))
    assert records.count(b"WARC-Scraper-Via: rendered") >= len(ids) + 2
    assert records.count(b'<span class="sku">JS-') >= len(ids)
    assert b'<a class="product-link" href="/js/p/' in records  # the lists, as the script built them
    # The revisit schedule knows each rendered page, as it knows any page.
    assert sum(stat_value(log, "revisit/new") or 0 for log in logs) == len(ids) + 2


class Listener:
    """A TCP listener that counts every connection (and answers 200, should one get through)."""

    def __init__(self, host: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((host, 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.hits += 1
            try:
                conn.settimeout(1)
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self.sock.close()


HOSTILE = """<!DOCTYPE html>
<html><head>
<link rel="preconnect" href="http://127.0.0.2:{C}">
<link rel="prefetch" href="http://127.0.0.2:{C}/prefetch">
<link rel="stylesheet" href="http://127.0.0.2:{C}/style.css">
<script src="http://localhost:{B}/script.js"></script>
</head><body>
<img src="http://127.0.0.2:{C}/image.png">
<iframe src="http://127.0.0.1:{B}/frame"></iframe>
<script>
const tries = [];
const attempt = (name, f) => {{ try {{ tries.push(Promise.resolve(f()).catch(() => null)); }} catch (e) {{}} }};
attempt("fetch", () => fetch("http://127.0.0.1:{B}/fetch"));
attempt("name", () => fetch("http://localhost:{B}/internal-name"));
attempt("xhr", () => {{ const x = new XMLHttpRequest(); x.open("GET", "http://127.0.0.2:{C}/xhr"); x.send(); }});
attempt("metadata", () => fetch("http://169.254.169.254/latest/meta-data/iam/security-credentials/"));
attempt("redirect", () => fetch("/redirect?to=http://127.0.0.1:{B}/redirected"));
attempt("redirect-metadata", () => fetch("/redirect?to=http://169.254.169.254/latest/meta-data/"));
attempt("beacon", () => navigator.sendBeacon("http://127.0.0.2:{C}/beacon", "x"));
attempt("events", () => new EventSource("http://127.0.0.1:{B}/events"));
attempt("ws", () => new WebSocket("ws://127.0.0.1:{B}/ws"));
attempt("popup", () => window.open("http://127.0.0.2:{C}/popup"));
attempt("webrtc", () => {{
  const pc = new RTCPeerConnection({{iceServers: [{{urls: "turn:127.0.0.2:{C}?transport=tcp", username: "u", credential: "p"}}]}});
  pc.createDataChannel("x");
  return pc.createOffer().then((o) => pc.setLocalDescription(o));
}});
attempt("own", () => fetch("/own").then((r) => r.text()).then((t) => {{ document.body.dataset.own = t; }}));
Promise.all(tries).then(() => setTimeout(() => {{ document.body.dataset.done = "1"; }}, 800));
</script>
</body></html>
"""

SPIDER = """
import scrapy


class HostileSpider(scrapy.Spider):
    name = "hostile"
    render = {"wait_for": "body[data-done]"}

    async def start(self):
        yield scrapy.Request(self.url, callback=self.parse)

    def parse(self, response):
        self.logger.info("RENDERED own=%s done=%s", response.css("body::attr(data-own)").get(),
                         response.css("body::attr(data-done)").get())
"""


class HostileSite:
    """The spider's own site (allowed): the hostile page, a redirector and an answer of its own;
    when each request came (``arrivals``: path, time.monotonic())."""

    def __init__(self, other: int, internal: int, page: bytes | None = None) -> None:
        page = page or HOSTILE.format(B=other, C=internal).encode()
        arrivals = self.arrivals = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                arrivals.append((self.path, time.monotonic()))
                if self.path.startswith("/redirect?to="):
                    self.send_response(302)
                    self.send_header("Location", self.path.split("=", 1)[1])
                    body = b""
                else:
                    self.send_response(200)
                    body = b"own site" if self.path.startswith("/own") else page
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_pages_scripts_reach_no_internal_address(clean, tmp_path) -> None:
    chromium()
    other, internal = Listener("127.0.0.1"), Listener("127.0.0.2")  # another loopback port; an internal host
    site = HostileSite(other.port, internal.port)
    project = project_with_spider(tmp_path, "hostile", SPIDER)
    try:
        # Every type goes to the boundary here, images and fonts too (none blocked unchecked).
        env = crawl_env(clean, FETCH_ALLOW_NETWORKS="127.0.0.1/32", RENDER_BLOCK_RESOURCES="none")
        started = time.monotonic()
        result = run_scrapy(env, "crawl", "hostile", "-a", f"url={site.url}", cwd=project, timeout=120)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))  # a late connection would be counted
    finally:
        site.close()
        other.close()
        internal.close()
    log = result.stderr
    assert result.returncode == 0 and "Traceback" not in log, log[-3000:]
    assert "RENDERED own=own site done=1" in log, log[-3000:]  # the scripts ran; its own site answered
    assert (other.hits, internal.hits) == (0, 0), log[-3000:]
    refused = stat_value(log, "render/refused/forbidden_address") or 0
    assert refused >= 9, log[-3000:]  # each address asked for, in each way that reached the routing
    assert "169.254.169.254 is a non-public address" in log, log[-3000:]
    assert f"http://127.0.0.1:{other.port}/redirected" in log  # the hop of the redirect was refused
    assert stat_value(log, "render/refused/forbidden_scheme") >= 1  # the WebSocket


POLITE = b"""<!DOCTYPE html><html><body><script>
Promise.all([0, 1, 2, 3, 4, 5, 6, 7].map((i) => fetch("/own?i=" + i)))
  .then(() => { document.body.dataset.own = "own site"; document.body.dataset.done = "1"; });
</script></body></html>"""


def test_a_rendered_pages_requests_to_its_own_site_wait_their_turns(clean, tmp_path) -> None:
    """Politeness counts what a page's scripts ask of its site: at 4 requests/s for the whole
    fleet, the page's 8 requests to its own site come over about 2 s, not at once."""
    chromium()
    site = HostileSite(0, 0, POLITE)
    project = project_with_spider(tmp_path, "hostile", SPIDER)
    try:
        env = crawl_env(clean, FETCH_ALLOW_NETWORKS="127.0.0.1/32", POLITENESS_RATE="4")
        result = run_scrapy(env, "crawl", "hostile", "-a", f"url={site.url}", cwd=project, timeout=120)
    finally:
        site.close()
    log = result.stderr
    assert result.returncode == 0 and "Traceback" not in log, log[-3000:]
    assert "RENDERED own=own site done=1" in log, log[-3000:]
    own = sorted(t for path, t in site.arrivals if path.startswith("/own"))
    assert len(own) == 8, site.arrivals
    assert own[-1] - own[0] >= 7 / 4 * 0.7, [round(t - own[0], 2) for t in own]
    assert stat_value(log, "render/polite_requests") == 8


def test_pages_that_keep_their_error_box_are_dead_letters_the_rest_stored(clean) -> None:
    """With no render again allowed (RENDER_ERROR_RETRIES=0), every product whose first answer is
    the shop's error box is a dead letter ``render:error_box`` (not an item without a price), and
    every other product is stored; `scrapy dlq requeue` then brings them in."""
    chromium()
    with DemoSite(Catalog(products=24)) as site:
        env = crawl_env(clean, DEMO_SITE_URL=site.url, FETCH_ALLOW_NETWORKS="127.0.0.1/32", RENDER_ERROR_RETRIES="0")
        first = run_scrapy(env, "crawl", "demo_js")
        listed = run_scrapy(env, "dlq", "list", "demo_js")
        failing = {p.id for p in site.js.products if p.id % 10 == 0}
        skus = site.js.skus()
        stored_first = {sku for (sku,) in clean.query("SELECT sku FROM products")}
        requeued = run_scrapy(env, "dlq", "requeue", "demo_js", "--all")
        again = run_scrapy(env, "crawl", "demo_js")
    assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr[-3000:]
    assert failing and listed.stdout.count("render:error_box") == len(failing), listed.stdout
    assert {int(p) for p in re.findall(r"/js/p/(\d+)\.html", listed.stdout)} == failing
    assert stored_first == {sku for sku in skus if int(sku[3:]) not in failing}
    assert requeued.returncode == 0 and again.returncode == 0, requeued.stderr[-2000:] + again.stderr[-2000:]
    assert {sku for (sku,) in clean.query("SELECT sku FROM products")} == skus  # shown once, fine the second time


def test_a_page_over_its_time_budget_is_a_timeout_then_a_dead_letter(clean, tmp_path) -> None:
    chromium()
    site = HostileSite(0, 0, b"<!DOCTYPE html><html><body>never done</body></html>")
    project = project_with_spider(tmp_path, "hostile", SPIDER)
    try:
        env = crawl_env(clean, FETCH_ALLOW_NETWORKS="127.0.0.1/32", RENDER_PAGE_TIMEOUT="1")
        started = time.monotonic()
        result = run_scrapy(
            env, "crawl", "hostile", "-a", f"url={site.url}", "-s", "RETRY_TIMES=1", cwd=project, timeout=120
        )
        took = time.monotonic() - started
        listed = run_scrapy(env, "dlq", "list", "hostile", cwd=project)
    finally:
        site.close()
    log = result.stderr
    # (Scrapy logs the traceback of a download that failed for good: it is the timeout's.)
    assert result.returncode == 0 and "Error downloading" in log and "Gave up retrying" in log, log[-3000:]
    assert stat_value(log, "render/timeouts") == 2, log[-3000:]  # the page, and its one retry
    assert "RENDER_PAGE_TIMEOUT" in log
    # Retried as any download (queued again as JSON, its render spec with it), then set aside.
    assert [p for p, _ in site.arrivals if p == "/"] == ["/", "/"]
    assert "DownloadTimeoutError" in listed.stdout and site.url in listed.stdout, listed.stdout
    assert took < 60


def test_a_bad_render_setting_or_spec_fails_at_start_by_name(services, tmp_path) -> None:
    env = crawl_env(services, RENDER_BLOCK_RESOURCES="image,videos")
    assert "videos" in check_one_line_error(run_scrapy(env, "crawl", "demo_js"), "RENDER_BLOCK_RESOURCES")
    project = project_with_spider(
        tmp_path, "badspec", SPIDER.replace("hostile", "badspec").replace('"wait_for"', '"wait_until"')
    )
    result = run_scrapy(crawl_env(services), "crawl", "badspec", "-a", "url=http://x.test/", cwd=project)
    assert "wait_until" in check_one_line_error(result, "HostileSpider.render")
    env = crawl_env(services, RENDER_BROWSER=str(tmp_path / "no-chromium"))
    assert "make tools" in check_one_line_error(run_scrapy(env, "crawl", "demo_js"), "RENDER_BROWSER")


def test_a_rendered_request_is_marked_plainly_and_asked_without_the_revisits_validators() -> None:
    """The mark is JSON (it is queued again by a retry or a dead letter); the API leaves the
    request alone; the document's validators, which say nothing of the data its scripts fetch, are
    not sent; robots.txt and requests marked False are left as they are."""
    import json

    from scrapy import Request
    from scrapy.http.request import NO_CALLBACK
    from scrapy.utils.test import get_crawler

    from scraper.rendering.handler import SPEC_META
    from scraper.rendering.middleware import RenderMiddleware
    from scraper.revisit.conditional import CONDITIONAL_META
    from scraper.spiders.demo_js import PRODUCT, DemoJsSpider

    crawler = get_crawler(DemoJsSpider, {"RENDER_BROWSER": CHROMIUM})
    crawler.spider = DemoJsSpider()
    middleware = RenderMiddleware(crawler)
    page = Request(
        "http://shop.test/js/p/1.html",
        callback=crawler.spider.parse_product,
        meta={"render": PRODUCT, CONDITIONAL_META: "key"},
        headers={"If-None-Match": '"v1"', "If-Modified-Since": "Tue, 01 Dec 2026 00:00:00 GMT"},
    )
    middleware.process_request(page)
    assert json.loads(json.dumps(page.meta[SPEC_META]))["retry_if"] == ".error-box"
    assert page.meta["scraping_api"] is False
    assert b"If-None-Match" not in page.headers and b"If-Modified-Since" not in page.headers
    assert CONDITIONAL_META not in page.meta
    robots = Request("http://shop.test/robots.txt", callback=NO_CALLBACK)
    plain = Request("http://shop.test/feed.json", callback=crawler.spider.parse, meta={"render": False})
    for request in (robots, plain):
        middleware.process_request(request)
        assert SPEC_META not in request.meta and "scraping_api" not in request.meta


def test_the_crawl_components_do_not_import_the_browser() -> None:
    """P1: a crawl that renders nothing loads every component it configures, and no Playwright."""
    code = (
        "import sys\n"
        "from scrapy.utils.misc import load_object\n"
        "from scraper import settings\n"
        "for path in [*settings.DOWNLOAD_HANDLERS.values(), *settings.DOWNLOADER_MIDDLEWARES, *settings.EXTENSIONS]:\n"
        "    if path:\n"
        "        load_object(path)\n"
        "assert 'scraper.rendering.handler' in sys.modules\n"
        "print('playwright' in sys.modules, 'playwright.async_api' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False False", out.stdout + out.stderr[-2000:]
