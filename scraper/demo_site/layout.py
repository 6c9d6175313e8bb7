"""The broken-layout drill: the shop rolls out a new product template to a share of its pages.

On a redesigned page the price is shown as ``<span class="amount">`` and the brand as
``<span class="maker">``, so a spider written for the old template misses them. The two
renames hit two independent shares of the product pages (chosen by product id, the same on
every run), as real redesigns roll out unevenly: the pages that lost their price get their
items rejected, those that lost only their brand store items without one. The JSON-LD is
untouched. ``DemoSite(catalog, break_layout=0.5)`` or ``scrapy demo --break-layout``.

The part ``bundle`` (never on by default) is a redesign that loses no field: the page shows the
price of a pack of three where the unit price was, under the same class (and in its JSON-LD).
Every field is there; a third of the values are three times too high.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import replace

from .catalog import Product, format_price
from .pages import Page

RENAMES = {"price": (b'class="price"', b'class="amount"'), "brand": (b'class="brand"', b'class="maker"')}
# Parts a test asks for by name, never on by default: the release date in words no reader takes
# ("Published on Apr 24, 2022").
EXTRA = {"published": (b'<time class="released">', b'<time class="released">Published on ')}


# Parts a test or a bench defines itself (a class renamed, a wrapper added, a decoy block...):
# name -> the page's HTML and its product -> the redesigned HTML. See :func:`define`.
CUSTOM: dict[str, Callable[[str, Product], str]] = {}


def define(name: str, change: Callable[[str, Product], str]) -> None:
    """A redesign named *name*, for ``DemoSite.break_layout(share, parts=(name,))``."""
    CUSTOM[name] = change


def redesigned(product: Product, part: str, share: float) -> bool:
    """Whether *part* of *product*'s page has the new layout (deterministic per product)."""
    return zlib.crc32(f"{part}:{product.id}".encode()) % 10_000 < share * 10_000


BUNDLE = 3


def bundled(product: Product, share: float, parts: tuple[str, ...]) -> Product:
    """*product* as a redesigned page shows it when *parts* include ``bundle``: a pack's price."""
    if "bundle" not in parts or share <= 0 or product.price is None or product.currency is None:
        return product
    if product.is_free or not redesigned(product, "bundle", share):
        return product
    price = product.price * BUNDLE
    return replace(product, price=price, price_display=format_price(price, product.currency, product.price_style))


def apply(page: Page, product: Product, share: float, parts: tuple[str, ...] = tuple(RENAMES)) -> Page:
    """*page* (the product's page) in the new layout where *share* says so (of *parts* alone)."""
    if share <= 0 or page.status != 200:
        return page
    body = page.body
    for part, (old, new) in (*RENAMES.items(), *EXTRA.items()):
        if part in parts and redesigned(product, part, share):
            body = body.replace(old, new)
    for part in parts:
        change = CUSTOM.get(part)
        if change is not None and redesigned(product, part, share):
            # Some pages are served in another charset: their bytes go through unchanged.
            body = change(body.decode("utf-8", "surrogateescape"), product).encode("utf-8", "surrogateescape")
    if body is page.body:
        return page
    return Page(page.status, page.content_type, body, page.headers)
