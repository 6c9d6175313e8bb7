"""Hostile pages: garbage bytes, binaries, wrong charsets, empty bodies, a decompression bomb.

A real HTTP server on loopback serves them next to one good product page; the generic
schema.org spider crawls the lot. The crawl must finish cleanly, store what is storable and
never hold a bomb in memory.
"""

from __future__ import annotations

import gzip
import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support.crawls import crawl_env, run_scrapy

PRODUCT = {
    "@context": "https://schema.org",
    "@type": "Product",
    "name": "Good Kettle",
    "sku": "GOOD-1",
    "offers": {"@type": "Offer", "price": "19.90", "priceCurrency": "EUR"},
}
MISLABELED = {**PRODUCT, "name": "Café Kettle", "sku": "LATIN-1"}


def page(body: str) -> bytes:
    return f"<html><head><title>t</title></head><body>{body}</body></html>".encode()


def jsonld(data: dict) -> str:
    return f'<script type="application/ld+json">{json.dumps(data, ensure_ascii=False)}</script>'


rng = random.Random(7)
PAGES: dict[str, tuple[str, dict[str, str], bytes]] = {
    "/": (
        "200",
        {"Content-Type": "text/html; charset=utf-8"},
        page(
            "".join(
                f'<a href="{p}">x</a>'
                for p in ["/product", "/garbage", "/binary", "/empty", "/mislabeled", "/bomb", "/unclosed", "/500"]
            )
        ),
    ),
    "/product": ("200", {"Content-Type": "text/html; charset=utf-8"}, page(jsonld(PRODUCT))),
    "/garbage": ("200", {"Content-Type": "text/html"}, bytes(rng.getrandbits(8) for _ in range(20000))),
    "/binary": ("200", {"Content-Type": "image/png"}, b"\x89PNG\r\n\x1a\n" + bytes(2000)),
    "/empty": ("200", {"Content-Type": "text/html"}, b""),
    # Declares UTF-8, is Latin-1: decoding must not crash, the product must still be stored.
    "/mislabeled": (
        "200",
        {"Content-Type": "text/html; charset=utf-8"},
        page(jsonld(MISLABELED)).decode("utf-8").encode("latin-1"),
    ),
    # 64 MiB of zeros in about 64 KiB of gzip.
    "/bomb": (
        "200",
        {"Content-Type": "text/html", "Content-Encoding": "gzip"},
        gzip.compress(b"\0" * (64 * 1024 * 1024), compresslevel=9),
    ),
    "/unclosed": ("200", {"Content-Type": "text/html"}, b"<html><body><div><a href='/product'>" + b"<p>" * 5000),
    "/500": ("500", {"Content-Type": "text/html"}, b"oops"),
}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, headers, body = PAGES.get(self.path, ("404", {"Content-Type": "text/html"}, b"no"))
        self.send_response(int(status))
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def hostile_site():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_hostile_pages_do_not_break_the_crawl(clean, hostile_site: str) -> None:
    env = crawl_env(clean, DOWNLOAD_MAXSIZE=str(8 * 1024 * 1024), RETRY_ENABLED="0")
    result = run_scrapy(env, "crawl", "schema_org", "-a", f"url={hostile_site}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-5000:]
    assert "Spider closed (finished)" in result.stderr
    rows = dict(clean.query("SELECT sku, title FROM products"))
    assert rows["GOOD-1"] == "Good Kettle"
    assert "LATIN-1" in rows and rows["LATIN-1"].endswith("Kettle")
    # The bomb was refused, not inflated into memory.
    assert "/bomb> because its body" in result.stderr and "exceeded DOWNLOAD_MAXSIZE" in result.stderr
    # The non-text page was skipped and counted.
    assert "'spider/non_text_responses': 1" in result.stderr
    # Every linked page was tried; only the server error is an error.
    assert "'log_count/ERROR': 1" in result.stderr and "Gave up retrying <GET http" in result.stderr
