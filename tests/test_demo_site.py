"""Tests for the bundled demo shop: catalog generator, HTML contract, server, CLI."""

from __future__ import annotations

import http.client
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from email.message import Message
from pathlib import Path

import pytest
from parsel import Selector

from scraper.demo_site import Catalog, DemoSite
from scraper.demo_site.catalog import BROKEN_KINDS, ODD_KINDS, Product

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(30)


# -- helpers ----------------------------------------------------------------


def fetch(url: str, method: str = "GET") -> tuple[int, Message, bytes]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers, exc.read()


def admin(site: DemoSite, path: str, method: str = "GET") -> tuple[int, dict]:
    status, _, body = fetch(site.origin + path, method)
    return status, json.loads(body)


def decode(headers: Message, body: bytes) -> str:
    return body.decode(headers.get_content_charset() or "utf-8")


def squash(text: str) -> str:
    return " ".join(text.split())


_SYMBOLS = {"$": "USD", "€": "EUR", "£": "GBP", "¥": "JPY"}
_DISPLAY = re.compile(r"(?P<pre>[$€£¥]|(?:USD|EUR|GBP|JPY) )?(?P<num>[0-9][0-9., ]*?)(?P<post> €| EUR)?")


def parse_display_price(text: str) -> tuple[Decimal, str]:
    """Reference parser for exactly the formats the demo site emits."""
    match = _DISPLAY.fullmatch(text)
    assert match, f"unexpected price format {text!r}"
    pre, num, post = match["pre"], match["num"], match["post"]
    if post or pre in ("EUR ",):
        currency = "EUR"
        european = pre == "EUR " or post is not None
    else:
        currency = _SYMBOLS.get(pre or "", (pre or "").strip())
        european = False
    if european:
        num = num.replace(".", "").replace(" ", "").replace(",", ".")
    else:
        num = num.replace(",", "")
    return Decimal(num).quantize(Decimal("0.01")), currency


_DATE_FORMATS = ["%d %b %Y", "%B %d, %Y", "%d.%m.%Y", "%b %d, %Y %I:%M %p"]


def parse_display_date(text: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        for fmt in _DATE_FORMATS:
            try:
                parsed = datetime.strptime(text, fmt)
                break
            except ValueError:
                continue
        else:
            raise AssertionError(f"unexpected date format {text!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def jsonld(sel: Selector) -> dict | None:
    raw = sel.css('script[type="application/ld+json"]::text').get()
    return None if raw is None else json.loads(raw)


# -- fixtures ---------------------------------------------------------------


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog(products=200, categories=8, per_page=20, seed=42)


@pytest.fixture(scope="module")
def site(catalog: Catalog):
    with DemoSite(catalog) as running:
        yield running


@pytest.fixture
def fresh_site():
    """A private server for tests that reprice or count requests."""
    with DemoSite(Catalog(products=60, seed=3)) as running:
        yield running


# -- catalog ----------------------------------------------------------------


def test_same_arguments_give_the_same_site() -> None:
    first, second = Catalog(products=80, seed=7), Catalog(products=80, seed=7)
    assert first == second
    assert first.pages() == second.pages()
    a, b = DemoSite(first), DemoSite(second)
    for path in first.pages():
        p, _, q = path.partition("?")
        assert a.page(p, q).body == b.page(p, q).body, path


def test_different_seed_gives_a_different_site() -> None:
    first, other = Catalog(products=80, seed=7), Catalog(products=80, seed=8)
    assert first != other
    assert [p.title for p in first.products] != [p.title for p in other.products]


def test_catalog_shape(catalog: Catalog) -> None:
    products = catalog.products
    assert [p.id for p in products] == list(range(1, 201))
    assert all(re.fullmatch(r"DS-\d{6}", p.sku) for p in products)
    assert len({p.sku for p in products}) == 200
    assert set(catalog.kinds.values()) == set(BROKEN_KINDS) | set(ODD_KINDS)
    assert len(catalog.broken_products()) >= 3
    assert {p.kind for p in catalog.broken_products()} == set(BROKEN_KINDS)
    assert len(catalog.valid_products()) + len(catalog.broken_products()) == 200
    assert catalog.multi_category_products()
    assert any(not p.title.isascii() for p in products)

    priced = [p for p in catalog.valid_products() if p.price is not None]
    assert {p.currency for p in priced} == {"USD", "EUR", "GBP", "JPY"}
    assert sum(p.price > 1000 for p in priced) >= 3
    assert all(p.price == p.price.quantize(Decimal(1)) for p in priced if p.currency == "JPY")
    free = [p for p in products if p.is_free]
    assert 1 <= len(free) <= 2
    assert all(p.price == Decimal("0.00") and p.currency == "USD" for p in free)

    for p in products:
        assert p.released.tzinfo is not None and p.released.utcoffset().total_seconds() == 0
        if p.released_date_only:
            assert (p.released.hour, p.released.minute) == (0, 0)

    assert len(set(catalog.pages())) == len(catalog.pages()) == catalog.page_count


@pytest.mark.parametrize("size", [20, 21, 39])
def test_small_catalogs_still_have_every_kind(size: int) -> None:
    small = Catalog(products=size, seed=size)
    assert set(small.kinds.values()) == set(BROKEN_KINDS) | set(ODD_KINDS)
    assert len(small.broken_products()) >= 3


def test_displayed_values_match_the_truth(catalog: Catalog) -> None:
    for p in catalog.products:
        assert parse_display_date(p.released_display) == p.released, p
        if p.kind == "garbage_price":
            assert p.price is None and not any(ch.isdigit() for ch in p.price_display)
        elif p.is_free:
            assert p.price_display == "Free"
        elif p.price is not None:
            assert parse_display_price(p.price_display) == (p.price, p.currency), p


def test_reprice_changes_only_the_first_n_prices(catalog: Catalog) -> None:
    repriced = catalog.with_reprice(5)
    assert repriced == Catalog(products=200, seed=42, reprice=5)
    eligible = [p.id for p in catalog.valid_products() if not p.is_free and p.price is not None]
    assert list(repriced.repriced_ids) == eligible[:5]
    for old, new in zip(catalog.products, repriced.products):
        if old.id in repriced.repriced_ids:
            assert new.price == old.price + 1
            assert new.price_display != old.price_display
            assert parse_display_price(new.price_display) == (new.price, new.currency)
            new = replace(new, price=old.price, price_display=old.price_display)
        assert new == old


# -- HTML contract over HTTP --------------------------------------------------


def _check_home(sel: Selector, catalog: Catalog, site: DemoSite) -> None:
    hrefs = sel.css("nav.categories a.category::attr(href)").getall()
    assert hrefs == [f"/c/{c.slug}/" for c in catalog.categories]
    assert sel.css('link[rel="canonical"]::attr(href)').get() == site.url


def _check_listing(sel: Selector, catalog: Catalog, path: str) -> None:
    match = re.fullmatch(r"/c/([a-z0-9-]+)/(?:\?page=(\d+))?", path)
    assert match, path
    slug, page = match[1], int(match[2] or 1)
    expected = [f"/c/{slug}/p/{p.id}.html" for p in catalog.listing(slug, page)]
    assert sel.css("ul.products li.product a.product-link::attr(href)").getall() == expected
    assert len(sel.css("li.product")) <= catalog.per_page
    next_href = sel.css('a.next[rel="next"]::attr(href)').get()
    if page < catalog.listing_page_count(slug):
        assert next_href == f"/c/{slug}/?page={page + 1}"
    else:
        assert next_href is None
    assert sel.css('a[href="/"]')
    assert len(sel.css("nav.categories a.category")) == len(catalog.categories)
    assert not [h for h in sel.css("a::attr(href)").getall() if h.startswith("/p/")]


def _check_product(sel: Selector, raw: bytes, product: Product, site: DemoSite) -> None:
    canonical = f"{site.origin}/p/{product.id}.html"
    assert sel.css('link[rel="canonical"]::attr(href)').get() == canonical
    assert sel.css("span.sku::text").get() == product.sku
    assert not sel.css("span.currency-hint")
    titles = sel.css("h1.title::text").getall()
    prices = sel.css("span.price::text").getall()
    data = jsonld(sel)
    if product.kind == "missing_title":
        assert titles == [] and "name" not in data
    else:
        assert titles == [product.title]
    if product.kind == "no_price":
        assert prices == [] and "offers" not in data
    elif product.kind == "garbage_price":
        assert prices == [product.price_display]
        assert data["offers"]["price"] == product.price_display
    else:
        assert prices == [product.price_display]
    if product.kind == "truncated":
        assert data is None and not raw.rstrip().endswith(b"</html>")
        return
    assert sel.css("span.brand::text").get() == product.brand
    assert squash(sel.css("div.description::text").get()) == product.description
    assert sel.css("time.released::text").get() == product.released_display
    assert sel.css("time.released::attr(datetime)").get() is None
    assert sel.css("span.availability::text").get() == "In stock"
    assert sel.css("img.main::attr(src)").get() == f"/img/{product.id}.jpg"
    assert data["@type"] == "Product" and data["sku"] == product.sku
    assert data["url"] == canonical
    assert data["image"] == f"{site.origin}/img/{product.id}.jpg"
    assert data["brand"] == {"@type": "Brand", "name": product.brand}
    assert datetime.fromisoformat(data["releaseDate"]) == product.released
    if product.price is not None:
        offer = data["offers"]
        assert Decimal(offer["price"]) == product.price
        assert re.fullmatch(r"\d+(\.\d\d)?", offer["price"])
        assert offer["priceCurrency"] == product.currency
        assert offer["availability"] == "https://schema.org/InStock"


def test_every_page_answers_with_the_contract(site: DemoSite, catalog: Catalog) -> None:
    product_path = re.compile(r"/c/[a-z0-9-]+/p/(\d+)\.html")
    seen_products = set()
    for path in catalog.pages():
        status, headers, body = fetch(site.origin + path)
        assert status == 200, path
        assert headers.get_content_type() == "text/html"
        assert int(headers["Content-Length"]) == len(body)
        if m := product_path.fullmatch(path):
            product = catalog.product(int(m[1]))
            seen_products.add(product.id)
            if product.kind == "empty":
                assert body == b""
                continue
            _check_product(Selector(text=decode(headers, body)), body, product, site)
        elif path == "/":
            _check_home(Selector(text=decode(headers, body)), catalog, site)
        else:
            _check_listing(Selector(text=decode(headers, body)), catalog, path)
    assert seen_products == {p.id for p in catalog.products}


def test_canonical_url_serves_the_same_page(site: DemoSite, catalog: Catalog) -> None:
    product = catalog.valid_products()[0]
    listed = fetch(site.origin + product.paths[0])
    canonical = fetch(site.origin + product.canonical_path)
    assert canonical[0] == 200 and canonical[2] == listed[2]


def test_product_in_two_categories_has_two_urls(site: DemoSite, catalog: Catalog) -> None:
    product = next(p for p in catalog.multi_category_products() if p.kind is None)
    assert len(product.paths) == 2 and product.paths[0] != product.paths[1]
    bodies, canonicals = [], set()
    for path in product.paths:
        assert path in catalog.pages()
        status, headers, body = fetch(site.origin + path)
        assert status == 200
        bodies.append(body)
        sel = Selector(text=decode(headers, body))
        canonicals.add(sel.css('link[rel="canonical"]::attr(href)').get())
    assert bodies[0] == bodies[1]
    assert canonicals == {f"{site.origin}/p/{product.id}.html"}


def test_cp1252_page_decodes_with_its_declared_charset(site: DemoSite, catalog: Catalog) -> None:
    [pid] = catalog.ids_by_kind("cp1252")
    product = catalog.product(pid)
    assert product in catalog.valid_products()
    status, headers, body = fetch(site.origin + product.paths[0])
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=windows-1252"
    with pytest.raises(UnicodeDecodeError):
        body.decode("utf-8")
    assert "€".encode("cp1252") in body
    sel = Selector(text=body.decode("cp1252"))
    assert sel.css("h1.title::text").get() == product.title
    assert "Crème" in product.title
    assert sel.css("span.price::text").get() == product.price_display
    assert product.price_display.endswith(" €") and product.currency == "EUR"


def test_empty_page_has_no_bytes(site: DemoSite, catalog: Catalog) -> None:
    [pid] = catalog.ids_by_kind("empty")
    status, headers, body = fetch(site.origin + catalog.product(pid).paths[0])
    assert (status, body, headers["Content-Length"]) == (200, b"", "0")
    assert headers["Content-Type"] == "text/html"


def test_truncated_page_still_parses(site: DemoSite, catalog: Catalog) -> None:
    [pid] = catalog.ids_by_kind("truncated")
    product = catalog.product(pid)
    assert product in catalog.valid_products()
    _, headers, body = fetch(site.origin + product.paths[0])
    text = decode(headers, body)
    assert not text.rstrip().endswith(">")  # cut mid-tag
    sel = Selector(text=text)
    assert sel.css("h1.title::text").get() == product.title
    assert sel.css("span.price::text").get() == product.price_display


@pytest.mark.parametrize(
    "path",
    [
        "/nope",
        "/img/1.jpg",
        "/c/no-such-category/",
        "/c/audio/?page=0",
        "/c/audio/?page=999",
        "/c/audio/?page=two",
        "/p/0.html",
        "/p/201.html",
        "/p/007.html",
        "/c/audio/p/999.html",
    ],
)
def test_unknown_paths_are_404(site: DemoSite, path: str) -> None:
    status, headers, body = fetch(site.origin + path)
    assert status == 404
    assert headers.get_content_type() == "text/html" and body


def test_product_under_a_foreign_category_is_404(site: DemoSite, catalog: Catalog) -> None:
    product = catalog.products[0]
    other = next(c.slug for c in catalog.categories if c.slug not in product.categories)
    assert fetch(f"{site.origin}/c/{other}/p/{product.id}.html")[0] == 404


def test_robots_and_slashless_category(site: DemoSite, catalog: Catalog) -> None:
    status, headers, body = fetch(site.origin + "/robots.txt")
    assert status == 200 and b"Allow: /" in body and b"Disallow: /\n" not in body
    slug = catalog.categories[0].slug
    conn = http.client.HTTPConnection("127.0.0.1", site.port, timeout=5)
    conn.request("GET", f"/c/{slug}")
    response = conn.getresponse()
    response.read()
    conn.close()
    assert (response.status, response.getheader("Location")) == (301, f"/c/{slug}/")


def test_canonical_follows_the_host_header(site: DemoSite, catalog: Catalog) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", site.port, timeout=5)
    for host, expected in [
        ("shop.example:8080", "http://shop.example:8080/p/1.html"),
        ('bad"host', f"{site.origin}/p/1.html"),
    ]:
        conn.request("GET", "/p/1.html", headers={"Host": host})
        body = conn.getresponse().read().decode("utf-8")
        assert Selector(text=body).css('link[rel="canonical"]::attr(href)').get() == expected
    conn.close()


def test_keep_alive_serves_many_pages_on_one_connection(site: DemoSite, catalog: Catalog) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", site.port, timeout=5)
    paths = catalog.pages()[:100]
    for path in paths:  # warm the render cache
        conn.request("GET", path)
        conn.getresponse().read()
    sock = conn.sock
    for i in range(500):
        conn.request("GET", paths[i % len(paths)])
        response = conn.getresponse()
        response.read()
        assert response.status == 200 and response.version == 11
    assert conn.sock is sock  # one connection served everything
    conn.close()


# -- admin endpoints ----------------------------------------------------------


def _prices(site: DemoSite) -> dict[int, str]:
    prices = {}
    for product in site.catalog.valid_products():
        _, headers, body = fetch(site.origin + product.canonical_path)
        prices[product.id] = Selector(text=decode(headers, body)).css("span.price::text").get()
    return prices


def test_reprice_endpoint(fresh_site: DemoSite) -> None:
    before = _prices(fresh_site)
    status, data = admin(fresh_site, "/_admin/reprice?count=3", "POST")
    assert status == 200
    eligible = [p.id for p in fresh_site.catalog.valid_products() if not p.is_free and p.price is not None]
    assert data == {"changed": eligible[:3]}
    after = _prices(fresh_site)
    assert {pid for pid in before if before[pid] != after[pid]} == set(eligible[:3])
    for pid in eligible[:3]:
        old, _ = parse_display_price(before[pid])
        new, _ = parse_display_price(after[pid])
        assert new == old + 1

    # Absolute, not cumulative.
    assert admin(fresh_site, "/_admin/reprice?count=3", "POST") == (200, data)
    assert _prices(fresh_site) == after
    assert admin(fresh_site, "/_admin/reprice?count=0", "POST") == (200, {"changed": []})
    assert _prices(fresh_site) == before

    assert admin(fresh_site, "/_admin/reprice?count=-1", "POST")[0] == 400
    assert admin(fresh_site, "/_admin/reprice?count=3")[0] == 405
    assert admin(fresh_site, "/_admin/nope")[0] == 404


def test_stats_endpoint(fresh_site: DemoSite) -> None:
    for path in ["/", "/", "/c/none/?page=2", "/nope", "/robots.txt"]:
        fetch(fresh_site.origin + path)
    status, data = admin(fresh_site, "/_admin/stats")
    assert status == 200
    assert data == {
        "requests": {"/": 2, "/c/none/?page=2": 1, "/nope": 1, "/robots.txt": 1},
        "total": 5,
        "throttled": 0,
        "not_modified": 0,
    }
    assert admin(fresh_site, "/_admin/reset-stats", "POST") == (200, {"ok": True})
    assert admin(fresh_site, "/_admin/stats") == (200, {"requests": {}, "total": 0, "throttled": 0, "not_modified": 0})
    summary = admin(fresh_site, "/_admin/catalog")[1]
    assert summary["products"] == 60 and summary["pages"] == fresh_site.catalog.page_count


def test_stats_are_thread_safe(fresh_site: DemoSite) -> None:
    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", fresh_site.port, timeout=5)
        for _ in range(50):
            conn.request("GET", "/")
            conn.getresponse().read()
        conn.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert admin(fresh_site, "/_admin/stats")[1] == {
        "requests": {"/": 400},
        "total": 400,
        "throttled": 0,
        "not_modified": 0,
    }


def test_delay_ms_slows_pages_but_not_admin() -> None:
    with DemoSite(Catalog(products=20), delay_ms=100) as slow:
        started = time.perf_counter()
        assert fetch(slow.url)[0] == 200
        assert time.perf_counter() - started >= 0.1
        assert admin(slow, "/_admin/stats")[0] == 200


def test_stop_frees_the_port() -> None:
    site = DemoSite(Catalog(products=20)).start()
    origin = site.origin
    conn = http.client.HTTPConnection("127.0.0.1", site.port, timeout=5)
    conn.request("GET", "/")
    conn.getresponse().read()  # leave an idle keep-alive connection open
    site.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(origin, timeout=2)
    conn.close()


# -- command line -------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_serves_until_signalled(sig: signal.Signals) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    args = ["--port", "0", "--products", "30", "--seed", "5", "--per-page", "10"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "scraper.demo_site", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        assert ready, "demo site printed nothing"
        line = proc.stdout.readline().strip()
        expected = Catalog(products=30, seed=5, per_page=10).page_count
        match = re.fullmatch(
            rf"demo site: (http://127\.0\.0\.1:(\d+)/) \(30 products, {expected} pages\)",
            line,
        )
        assert match, line
        assert fetch(match[1])[0] == 200
        proc.send_signal(sig)
        assert proc.wait(timeout=5) == 0
        assert proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
