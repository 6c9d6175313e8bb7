"""The ``?ref=`` layout: product pages linked as ``/p/<id>.html?ref=<category>``, no canonical link.

Shops that count which listing a click came from put it in the product link. A product listed in
two categories is then one page under two URLs, and the page does not say which is its own: no
``<link rel="canonical">``, no URL in its JSON-LD. Only what it yields tells (the same product).

Which of the two links yields a product first is the shop's to switch (``first``): the product
page reached by the other link answers late (``LATE``), as when the links are found in another
order. A product may also be listed in its home category only (``home_only``), as before the
shop adds it to a second one. ``DemoSite(catalog, ref_links=RefLinks())`` or
``python -m scraper.demo_site --ref-links``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs

from .catalog import Catalog
from .pages import Page

#: How late a product page reached by the link that comes second answers, in seconds.
LATE = 0.6
FIRST = ("home", "other")

_PRODUCT_LINK = re.compile(rb'<li class="product"><a class="product-link" href="/c/([a-z0-9-]+)/p/(\d+)\.html"')
_ITEM = re.compile(rb'<li class="product"><a class="product-link" href="/c/([a-z0-9-]+)/p/(\d+)\.html".*?</li>\n?')
_CANONICAL = re.compile(rb'<link rel="canonical" href="[^"]*">\n')
_JSONLD_URL = re.compile(rb', "url": "[^"]*"')


@dataclass(frozen=True)
class RefLinks:
    first: str = "home"  # whose link yields a product first: its home category's, or the other's
    home_only: bool = False  # each product listed in its home category only

    def __post_init__(self) -> None:
        if self.first not in FIRST:
            raise ValueError(f"first must be one of {FIRST}, not {self.first!r}")

    def listing(self, page: Page, catalog: Catalog) -> Page:
        """A listing page whose product links name the listing in ``?ref=``."""
        body = page.body
        if self.home_only:

            def listed(match: re.Match[bytes]) -> bytes:
                product = catalog.product(int(match[2]))
                home = product is not None and product.home_category == match[1].decode()
                return match[0] if home else b""

            body = _ITEM.sub(listed, body)
        body = _PRODUCT_LINK.sub(
            lambda m: b'<li class="product"><a class="product-link" href="/p/' + m[2] + b".html?ref=" + m[1] + b'"',
            body,
        )
        return Page(page.status, page.content_type, body, page.headers)

    @staticmethod
    def product(page: Page) -> Page:
        """A product page that says nothing of its own URL."""
        body = _JSONLD_URL.sub(b"", _CANONICAL.sub(b"", page.body, count=1))
        return Page(page.status, page.content_type, body, page.headers)

    def delay(self, catalog: Catalog, path: str, query: str) -> float:
        """How late the product page at *path*?*query* answers: LATE when its ``ref`` is the link
        that comes second."""
        match = re.fullmatch(r"/p/(\d+)\.html", path)
        refs = parse_qs(query).get("ref") if match else None
        product = catalog.product(int(match[1])) if match and refs else None
        if product is None or len(product.categories) < 2:
            return 0.0
        from_home = refs[-1] == product.home_category
        return LATE if from_home != (self.first == "home") else 0.0
