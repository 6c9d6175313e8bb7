"""Local HTTP server for the demo shop.

Built on ``ThreadingHTTPServer`` with HTTP/1.1 keep-alive, since crawlers
reuse connections and a fresh TCP handshake per page would dominate the
timings of anything benchmarked against this site.
"""

from __future__ import annotations

import json
import re
import socket
import socketserver
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from email.utils import parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from . import layout, pages
from .catalog import Catalog
from .changes import ChangeClock
from .js_section import JsSection
from .pages import Page
from .ref_links import RefLinks
from .sections import SECTIONS, render_section, section_route

__all__ = ["DemoSite"]

_PRODUCT = re.compile(r"/c/([a-z0-9-]+)/p/([1-9][0-9]*)\.html")
_CANONICAL = re.compile(r"/p/([1-9][0-9]*)\.html")
_LISTING = re.compile(r"/c/([a-z0-9-]+)/")
_LISTING_BARE = re.compile(r"/c/([a-z0-9-]+)")
_SECTION_PREFIXES = frozenset(f"/{prefix}/" for prefix in SECTIONS)
_PAGE_NUMBER = re.compile(r"[1-9][0-9]{0,6}")
# The Host header ends up inside HTML and JSON; anything outside this shape
# falls back to the server's own address instead of being echoed.
_HOST = re.compile(r"(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")
_MAX_BODY = 1 << 20
_ADMIN_ROUTES = {
    "/_admin/stats": "GET",
    "/_admin/catalog": "GET",
    "/_admin/reprice": "POST",
    "/_admin/reset-stats": "POST",
}

_RouteKey = tuple[Any, ...]


def _page_number(query: str) -> int | None:
    values = parse_qs(query).get("page")
    if not values:
        return 1
    return int(values[-1]) if _PAGE_NUMBER.fullmatch(values[-1]) else None


def _route(catalog: Catalog, path: str, query: str) -> _RouteKey | None:
    """Map a request to a cache key, or None for 404."""
    if path == "/":
        return ("home",)
    if path == "/robots.txt":
        return ("robots",)
    if path == "/sitemap.xml":
        return ("sitemap",)
    if path == "/sitemap.xml.gz":
        return ("sitemap.gz",)
    if path[:4] in _SECTION_PREFIXES:
        return section_route(catalog, path)
    if m := _PRODUCT.fullmatch(path):
        product = catalog.product(int(m[2]))
        if product is None or m[1] not in product.categories:
            return None
        return ("product", product.id)
    if m := _CANONICAL.fullmatch(path):
        return ("product", int(m[1])) if catalog.product(int(m[1])) else None
    if m := _LISTING.fullmatch(path):
        page = _page_number(query)
        if catalog.category(m[1]) is None or page is None:
            return None
        if page > catalog.listing_page_count(m[1]):
            return None
        return ("listing", m[1], page)
    if (m := _LISTING_BARE.fullmatch(path)) and catalog.category(m[1]):
        page = _page_number(query) or 1
        return ("redirect", catalog.listing_path(m[1], page))
    return None


class _Renderer:
    """One catalog version plus its lazily rendered pages.

    Repricing swaps in a whole new renderer, so a request never sees a mix
    of old and new pages and the cache never needs invalidating.
    """

    def __init__(
        self,
        catalog: Catalog,
        break_layout: float = 0.0,
        parts: tuple[str, ...] = tuple(layout.RENAMES),
        changes: ChangeClock | None = None,
    ) -> None:
        self.catalog = catalog
        self.break_layout = break_layout
        self.parts = parts
        # With a change clock: product pages as of its day, with validators (see changes.py).
        self.changes = changes
        self._cache: dict[_RouteKey, Page] = {}

    def page(self, path: str, query: str) -> Page:
        key = _route(self.catalog, path, query)
        if key is None:
            return _NOT_FOUND
        page = self._cache.get(key)
        if page is None:
            # Unlocked on purpose: two threads racing here render identical
            # bytes, which is cheaper than serialising every miss.
            page = self._render(key)
            self._cache[key] = page
        return page

    def _render(self, key: _RouteKey) -> Page:
        kind = key[0]
        if kind == "home":
            return pages.render_home(self.catalog)
        if kind == "robots":
            return pages.render_robots()
        if kind == "sitemap":
            return pages.render_sitemap(self.catalog, self.changes)
        if kind == "sitemap.gz":  # the same, as a gzipped file (served with its own origin: see body_for)
            plain = pages.render_sitemap(self.catalog, self.changes)
            return Page(200, "application/x-gzip", plain.body, gzipped=True)
        if kind == "listing":
            page = pages.render_listing(self.catalog, key[1], key[2])
            return page if page is not None else _NOT_FOUND
        if kind == "product":
            product = self.catalog.product(key[1])
            assert product is not None
            product = layout.bundled(product, self.break_layout, self.parts)
            if self.changes is None:
                return layout.apply(pages.render_product(self.catalog, product), product, self.break_layout, self.parts)
            served = self.changes.serve(product)
            page = layout.apply(
                pages.render_product(self.catalog, served.product), served.product, self.break_layout, self.parts
            )
            validators = (("ETag", served.etag), ("Last-Modified", served.last_modified))
            return replace(page, headers=page.headers + validators)
        if kind == "section":
            return render_section(self.catalog, key[1], key[2])
        if kind == "redirect":
            return Page(301, "text/html; charset=utf-8", b"", (("Location", key[1]),))
        raise ValueError(f"unknown route {key!r}")


_NOT_FOUND = pages.render_not_found()


class DemoSite:
    """The demo shop served from a background thread.

    >>> with DemoSite(Catalog(products=50)) as site:
    ...     site.url  # doctest: +SKIP
    'http://127.0.0.1:41234/'
    """

    def __init__(
        self,
        catalog: Catalog,
        host: str = "127.0.0.1",
        port: int = 0,
        delay_ms: int = 0,
        break_layout: float = 0.0,
        crawl_delay: float = 0.0,
        tracking: bool = False,
        changes: ChangeClock | None = None,
        ref_links: RefLinks | None = None,
    ) -> None:
        self.host = host
        # Announced in robots.txt (``Crawl-delay``), for every user agent; 0: none.
        self.crawl_delay = crawl_delay
        # Listing pages link each product twice, as shops that track clicks do: once with campaign
        # parameters and a click id, once with a session id in the path too (see tracked_links).
        self.tracking = tracking
        # Product links as /p/<id>.html?ref=<category> and no canonical link (see ref_links.py);
        # switched between runs by assigning another RefLinks.
        self.ref_links = ref_links
        self.delay = max(0, delay_ms) / 1000
        self._requested_port = port
        # The share of product pages in a new layout (see layout.py); 0 serves the shop as is.
        self._renderer = _Renderer(catalog, break_layout, changes=changes)
        # /js/: products that exist only once a script has run (see js_section.py).
        self.js = JsSection(catalog)
        self._lock = threading.Lock()
        self._stats: Counter[str] = Counter()
        # When requests arrived (time.monotonic) and how many were served at once: what a
        # politeness limit is judged by. Bounded so a long benchmark does not grow it forever.
        self._arrivals: deque[float] = deque(maxlen=1_000_000)
        self._in_flight = 0
        self._max_in_flight = 0
        # A limit the shop does not announce (requests per second from all clients together, 0:
        # none): past it, over any 1-second window, it answers 429 (see limit_rate).
        self._rate_limit = 0.0
        self.limit_answer = 429
        self._served: deque[float] = deque()
        self._throttled = 0
        self._not_modified = 0
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> DemoSite:
        if self._httpd is not None:
            raise RuntimeError("demo site already started")
        self._httpd = _Server((self.host, self._requested_port), self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            # Short poll so stop() returns promptly in tests.
            kwargs={"poll_interval": 0.05},
            name="demo-site",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self._httpd = self._thread = None
        httpd.shutdown()
        httpd.server_close()
        httpd.close_connections()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> DemoSite:
        return self if self._httpd is not None else self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- addresses ---------------------------------------------------------

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("demo site not started")
        return int(self._httpd.server_address[1])

    @property
    def origin(self) -> str:
        """Scheme, host and port without a trailing slash."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        return self.origin + "/"

    # -- content and admin -------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        return self._renderer.catalog

    def page(self, path: str, query: str = "") -> Page:
        """What the server answers for ``path`` (before Host substitution)."""
        if path.startswith("/js/"):
            return self.js.page(path, query) or _NOT_FOUND
        if self.crawl_delay and path == "/robots.txt":
            return pages.render_robots(self.crawl_delay)
        if ";" in path:
            path = _SESSION_IN_PATH.sub("", path)  # a session id in the path names no other page
        page = self._renderer.page(path, query)
        if self.tracking and path.startswith("/c/") and "/p/" not in path and page.status == 200:
            return tracked_links(page, path, query)
        ref_links = self.ref_links
        if ref_links is not None and page.status == 200 and path != "/":
            if "/p/" not in path:
                return ref_links.listing(page, self.catalog) if path.startswith("/c/") else page
            return ref_links.product(page)
        return page

    def answer_delay(self, path: str, query: str) -> float:
        """Seconds the answer to *path*?*query* waits (``delay_ms``, and a ``?ref=`` link that
        comes second, see ref_links.py)."""
        if path.startswith("/js/"):
            return self.delay + self.js.delay(path)
        ref_links = self.ref_links
        if ref_links is None:
            return self.delay
        return self.delay + ref_links.delay(self.catalog, path, query)

    def reprice(self, count: int) -> list[int]:
        """Serve the catalog with ``count`` products repriced; returns their ids."""
        with self._lock:
            current = self._renderer.catalog
            if count != current.reprice:
                self._renderer = _Renderer(
                    current.with_reprice(count), self._renderer.break_layout, self._renderer.parts, self.changes
                )
            return list(self._renderer.catalog.repriced_ids)

    def remove(self, count: int) -> list[int]:
        """Serve the catalog without ``count`` of its ordinary products (the lowest ids; 0
        brings them all back); returns their ids."""
        with self._lock:
            current = self._renderer.catalog
            base = current.with_removed(())
            ids = tuple(p.id for p in base.valid_products() if p.kind is None)[:count]
            if ids != current.removed:
                self._renderer = _Renderer(
                    current.with_removed(ids), self._renderer.break_layout, self._renderer.parts, self.changes
                )
            return list(ids)

    def break_layout(self, share: float, parts: tuple[str, ...] = tuple(layout.RENAMES)) -> None:
        """From now on serve *share* of the product pages in the new layout (see layout.py), for
        the *parts* named (``price``, ``brand``)."""
        with self._lock:
            self._renderer = _Renderer(self._renderer.catalog, share, parts, self.changes)

    @property
    def changes(self) -> ChangeClock | None:
        return self._renderer.changes

    def set_day(self, day: int) -> list[int]:
        """Serve the shop as its change clock has it on *day*; returns the products that changed
        on that day."""
        clock = self.changes
        if clock is None:
            raise RuntimeError("this demo site has no change clock (DemoSite(..., changes=ChangeClock(...)))")
        with self._lock:
            clock.day = day
            self._renderer = _Renderer(self._renderer.catalog, self._renderer.break_layout, self._renderer.parts, clock)
        return clock.changed_on(day)

    def limit_rate(self, per_second: float, answer: int = 429) -> None:
        """From now on answer 429 to any request past *per_second* in the last second (0: no limit;
        below 1: to every request); *answer* 403: a challenge page instead, as a bot wall does."""
        with self._lock:
            self.limit_answer = answer
            self._rate_limit = per_second
            self._served.clear()

    def over_limit(self) -> bool:
        """Whether this request is past the hidden rate limit (counted as ``throttled``)."""
        if not self._rate_limit:
            return False
        now = time.monotonic()
        with self._lock:
            while self._served and self._served[0] <= now - 1.0:
                self._served.popleft()
            if len(self._served) >= self._rate_limit or self._rate_limit < 1:
                self._throttled += 1
                return True
            self._served.append(now)
            return False

    def record(self, target: str) -> None:
        with self._lock:
            self._stats[target] += 1
            self._arrivals.append(time.monotonic())

    def record_not_modified(self) -> None:
        with self._lock:
            self._not_modified += 1

    @contextmanager
    def serving(self) -> Iterator[None]:
        with self._lock:
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1

    def arrivals(self) -> list[float]:
        """Arrival times (``time.monotonic()``) of the requests counted in :meth:`stats`."""
        with self._lock:
            return list(self._arrivals)

    def max_in_flight(self) -> int:
        """The most requests that were being served at the same time."""
        with self._lock:
            return self._max_in_flight

    def in_flight(self) -> int:
        """Requests being served now (a client may have read its whole answer a moment before
        the server is done with it)."""
        with self._lock:
            return self._in_flight

    def connections_opened(self) -> int:
        """Connections clients have opened since the site started."""
        return self._httpd.opened if self._httpd is not None else 0

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": dict(self._stats),
                "total": sum(self._stats.values()),
                "throttled": self._throttled,
                "not_modified": self._not_modified,
            }

    def reset_stats(self) -> None:
        with self._lock:
            self._throttled = self._not_modified = 0
            self._stats.clear()
            self._arrivals.clear()
            self._max_in_flight = self._in_flight


_SESSION_IN_PATH = re.compile(r";jsessionid=[^/?#;]*", re.IGNORECASE)
_PRODUCT_HREF = re.compile(rb'href="(/c/[a-z0-9-]+/p/\d+\.html)"')


def tracked_links(page: Page, path: str, query: str) -> Page:
    """A listing page whose product links carry what click-tracking shops add: campaign
    parameters and a click id that differ by listing page, and a second link per product with a
    session id in the path. The same product page, reached by many URLs."""
    tag = f"{path.strip('/').replace('/', '-')}-{query or 'p1'}".encode()

    def two_links(match: re.Match[bytes]) -> bytes:
        href = match.group(1)
        first = href + b"?utm_source=listing&utm_medium=" + tag + b"&gclid=" + tag
        second = href + b";jsessionid=" + tag + b"?utm_campaign=title&fbclid=" + tag
        return b'href="' + first + b'" data-also="' + second + b'"'

    body = _PRODUCT_HREF.sub(two_links, page.body)
    body = body.replace(
        b"</main>",
        b"".join(
            b'<a class="product-link also" href="' + m.group(1) + b'">again</a>\n'
            for m in re.finditer(rb'data-also="([^"]+)"', body)
        )
        + b"</main>",
        1,
    )
    return Page(page.status, page.content_type, body, page.headers)


# What a bot wall answers a client it takes for a robot (the markers scrapers look for).
CHALLENGE_PAGE = (
    b"<!DOCTYPE html><html><head><title>Just a moment...</title></head><body>"
    b'<div class="g-recaptcha" data-sitekey="demo"></div></body></html>\n'
)


_VALIDATORS = ("ETag", "Last-Modified")


def _still_valid(page: Page, request_headers: Any) -> bool:
    """RFC 9110 13.1: If-None-Match first (weak comparison); If-Modified-Since only without it."""
    validators = dict(h for h in page.headers if h[0] in _VALIDATORS)
    if "ETag" not in validators:
        return False
    match = request_headers.get("If-None-Match")
    if match is not None:
        tags = {t.strip().removeprefix("W/") for t in match.split(",")}
        return "*" in tags or validators["ETag"].removeprefix("W/") in tags
    since = request_headers.get("If-Modified-Since")
    if since is None:
        return False
    try:
        return parsedate_to_datetime(validators["Last-Modified"]) <= parsedate_to_datetime(since)
    except (TypeError, ValueError):
        return False  # an unreadable date is ignored, as the RFC says


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Idle keep-alive connections must not make stop() hang.
    block_on_close = False
    # Crawlers open many connections at once; the default backlog of 5
    # drops SYNs and costs a one-second retransmit each.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], site: DemoSite) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.site = site
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self.opened = 0  # connections accepted: what a client's connection reuse is judged by
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the FQDN, which can block for
        # seconds without DNS; the name is never used here.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients hanging up mid-response are routine for a crawler target.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)

    def track(self, connection: socket.socket, active: bool) -> None:
        with self._connections_lock:
            if active:
                self.opened += 1
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def close_connections(self) -> None:
        # Handler threads blocked on idle keep-alive sockets would otherwise
        # keep serving after stop().
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "DemoShop/1.0"
    sys_version = ""
    # Headers and body go out in separate writes; Nagle plus delayed ACKs
    # would add ~40 ms to every keep-alive response.
    disable_nagle_algorithm = True
    # Idle keep-alive connections give their thread back eventually.
    timeout = 30
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._discard_body()
        self._handle()

    def _handle(self) -> None:
        split = urlsplit(self.path)
        if split.path.startswith("/_admin/"):
            self._admin(split.path, split.query)
            return
        site = self.server.site
        site.record(self.path)
        if site.over_limit():
            if site.limit_answer == 403:  # a challenge page, as bot walls answer a fast client
                self._send(403, "text/html; charset=utf-8", CHALLENGE_PAGE, ())
            else:
                self._send(429, "text/plain; charset=utf-8", b"too many requests\n", ())
            return
        if self.command == "POST":
            allow = (("Allow", "GET, HEAD"),)
            self._send(405, "text/plain; charset=utf-8", b"method not allowed\n", allow)
            return
        with site.serving():
            delay = site.answer_delay(split.path, split.query)
            if delay:
                time.sleep(delay)
            page = site.page(split.path, split.query)
            if page.status == 200 and site.changes is not None and _still_valid(page, self.headers):
                site.record_not_modified()
                self._send(304, page.content_type, b"", tuple(h for h in page.headers if h[0] in _VALIDATORS))
                return
            self._send(page.status, page.content_type, page.body_for(self._origin()), page.headers)

    def _origin(self) -> str:
        host = self.headers.get("Host", "")
        if _HOST.fullmatch(host):
            return f"http://{host}"
        return self.server.site.origin

    def _admin(self, path: str, query: str) -> None:
        site = self.server.site
        method = "GET" if self.command == "HEAD" else self.command
        expected = _ADMIN_ROUTES.get(path)
        if expected is None:
            self._json(404, {"error": "unknown admin endpoint"})
        elif method != expected:
            self._json(405, {"error": f"use {expected}"}, (("Allow", expected),))
        elif path == "/_admin/stats":
            self._json(200, site.stats())
        elif path == "/_admin/catalog":
            self._json(200, site.catalog.summary())
        elif path == "/_admin/reset-stats":
            site.reset_stats()
            self._json(200, {"ok": True})
        else:
            values = parse_qs(query).get("count", [""])
            if not values[-1].isascii() or not values[-1].isdigit():
                self._json(400, {"error": "count must be a non-negative integer"})
            else:
                self._json(200, {"changed": site.reprice(int(values[-1]))})

    def _discard_body(self) -> None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            # Not worth parsing for an admin API; just don't reuse the stream.
            self.close_connection = True
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = 0
        if length > _MAX_BODY:
            self.close_connection = True
        elif length > 0:
            self.rfile.read(length)

    def _json(self, status: int, data: object, headers: tuple[tuple[str, str], ...] = ()) -> None:
        body = json.dumps(data, sort_keys=True).encode("utf-8")
        self._send(status, "application/json", body, headers)

    def _send(
        self,
        status: int,
        content_type: str,
        body: bytes,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)
