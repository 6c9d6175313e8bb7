"""``/js/``: a section of the demo shop that exists only once its script has run.

Its pages are shells: ``/js/app.js`` fetches the products from a JSON endpoint and builds the
page, as single-page shops do. What a renderer has to cope with is all here:

* content after a delay: a product page shows its details a moment after ``load``
  (``JS_DETAIL_DELAY_MS``), from ``/js/api/products/<id>``;
* "Load more": ``/js/`` lists ``JS_BATCH`` products, then a button fetches the next batch
  (disabled while it loads) until there are no more, and disappears;
* infinite scroll: ``/js/scroll/`` lists the same products, the next batch each time the end of
  the list comes into view;
* an occasional error: every ``JS_ERROR_EVERY``-th product's first answer is a 503, which the page
  shows as an error box (a second render is fine).

A plain HTTP fetch of any of these pages finds no product at all. Products are the catalog's
ordinary ones, with SKUs of their own (``JS-000001``).
"""

from __future__ import annotations

import json
import re
import threading
from html import escape

from .catalog import Catalog, Product
from .pages import ORIGIN, Page

__all__ = ["JsSection"]

JS_BATCH = 20
JS_DETAIL_DELAY_MS = 150
JS_API_DELAY = 0.03  # seconds the JSON endpoint takes, like a real API
JS_ERROR_EVERY = 10

_PRODUCT = re.compile(r"/js/p/([1-9][0-9]*)\.html")
_API_PRODUCT = re.compile(r"/js/api/products/([1-9][0-9]*)")
_HTML = "text/html; charset=utf-8"

_APP = """
"use strict";
const root = document.getElementById("app");
const kind = root.dataset.kind;
const batch = %(batch)d;

function esc(text) {
  const span = document.createElement("span");
  span.textContent = text;
  return span.innerHTML;
}

function fail(where) {
  const box = document.createElement("div");
  box.className = "error-box";
  box.textContent = "Something went wrong loading " + where + ". Please try again.";
  root.appendChild(box);
}

async function listing(scroll) {
  const list = document.createElement("ul");
  list.className = "products";
  root.appendChild(list);
  let offset = 0, total = Infinity, loading = false;
  const more = document.createElement("button");
  more.className = "load-more";
  more.textContent = "Load more";
  const sentinel = document.createElement("div");
  sentinel.className = "sentinel";
  sentinel.style.height = "1px";
  async function next() {
    if (loading || offset >= total) return;
    loading = true;
    more.disabled = true;
    const answer = await fetch("/js/api/products?offset=" + offset + "&limit=" + batch);
    if (!answer.ok) { loading = false; more.disabled = false; fail("the list"); return; }
    const data = await answer.json();
    total = data.total;
    for (const p of data.products) {
      const item = document.createElement("li");
      item.className = "product";
      item.style.height = "40px";
      item.innerHTML = '<a class="product-link" href="' + p.url + '">' + esc(p.title) + "</a>";
      list.appendChild(item);
    }
    offset += data.products.length;
    loading = false;
    more.disabled = false;
    if (offset >= total) { more.remove(); sentinel.remove(); }
  }
  if (scroll) {
    root.appendChild(sentinel);
    new IntersectionObserver((entries) => {
      if (entries.some((e) => e.isIntersecting)) next();
    }).observe(sentinel);
  } else {
    more.addEventListener("click", next);
    root.appendChild(more);
    await next();
  }
}

async function product(id) {
  await new Promise((resolve) => setTimeout(resolve, %(delay)d));
  const answer = await fetch("/js/api/products/" + id);
  if (!answer.ok) { fail("this product"); return; }
  const p = await answer.json();
  root.innerHTML =
    '<main class="product-detail">' +
    '<h1 class="title">' + esc(p.title) + "</h1>" +
    '<p>SKU: <span class="sku">' + esc(p.sku) + "</span></p>" +
    '<p>Brand: <span class="brand">' + esc(p.brand) + "</span></p>" +
    '<p class="price-box">Price: <span class="price">' + esc(p.price) + "</span></p>" +
    '<p>Released: <time class="released">' + esc(p.released) + "</time></p>" +
    "</main>";
}

if (kind === "product") product(root.dataset.id);
else listing(kind === "scroll");
"""


class JsSection:
    """The ``/js/`` pages of one catalog, and which products already failed once."""

    def __init__(self, catalog: Catalog) -> None:
        self.products = [p for p in catalog.products if p.kind is None]
        self._by_id = {p.id: p for p in self.products}
        self._failed: set[int] = set()
        self._lock = threading.Lock()
        self._app = Page(
            200, "text/javascript; charset=utf-8", (_APP % {"batch": JS_BATCH, "delay": JS_DETAIL_DELAY_MS}).encode()
        )

    @staticmethod
    def sku(product: Product) -> str:
        return f"JS-{product.id:06d}"

    def skus(self) -> set[str]:
        return {self.sku(p) for p in self.products}

    def delay(self, path: str) -> float:
        return JS_API_DELAY if path.startswith("/js/api/") else 0.0

    def page(self, path: str, query: str) -> Page | None:
        """The answer to *path* under ``/js/``, or None (not found)."""
        if path == "/js/app.js":
            return self._app
        if path == "/js/":
            return _shell("Demo Shop: all products", "listing", f"{ORIGIN}/js/")
        if path == "/js/scroll/":
            return _shell("Demo Shop: all products, scrolling", "scroll", f"{ORIGIN}/js/scroll/")
        if m := _PRODUCT.fullmatch(path):
            product = self._by_id.get(int(m[1]))
            if product is None:
                return None
            return _shell(product.title, "product", f"{ORIGIN}/js/p/{product.id}.html", product.id)
        if path == "/js/api/products":
            return self._listing(query)
        if m := _API_PRODUCT.fullmatch(path):
            return self._product(int(m[1]))
        return None

    def _listing(self, query: str) -> Page:
        values = dict(part.partition("=")[::2] for part in query.split("&") if part)
        try:
            offset = max(0, int(values.get("offset", "0")))
            limit = min(100, max(1, int(values.get("limit", str(JS_BATCH)))))
        except ValueError:
            return _json(400, {"error": "offset and limit are numbers"})
        chosen = self.products[offset : offset + limit]
        return _json(
            200,
            {
                "total": len(self.products),
                "products": [{"id": p.id, "title": p.title, "url": f"/js/p/{p.id}.html"} for p in chosen],
            },
        )

    def _product(self, product_id: int) -> Page:
        product = self._by_id.get(product_id)
        if product is None:
            return _json(404, {"error": "no such product"})
        if product_id % JS_ERROR_EVERY == 0:
            with self._lock:
                first = product_id not in self._failed
                self._failed.add(product_id)
            if first:
                return _json(503, {"error": "try again"})
        return _json(
            200,
            {
                "id": product.id,
                "sku": self.sku(product),
                "title": product.title,
                "brand": product.brand,
                "price": product.price_display,
                "released": product.released_display,
            },
        )


def _shell(title: str, kind: str, canonical: str, product_id: int | None = None) -> Page:
    data_id = f' data-id="{product_id}"' if product_id is not None else ""
    text = (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{escape(title)}</title>\n"
        f'<link rel="canonical" href="{canonical}">\n'
        '<script src="/js/app.js" defer></script>\n'
        "</head>\n<body>\n"
        f'<div id="app" data-kind="{kind}"{data_id}></div>\n'
        "<noscript>This shop needs JavaScript.</noscript>\n"
        "</body>\n</html>\n"
    )
    return Page(200, _HTML, text.encode("utf-8"))


def _json(status: int, data: object) -> Page:
    return Page(status, "application/json", json.dumps(data).encode("utf-8"))
