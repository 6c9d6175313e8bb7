"""The broken-layout drill: the shop rolls out a new product template to a share of its pages.

On a redesigned page the price is shown as ``<span class="amount">`` and the brand as
``<span class="maker">``, so a spider written for the old template misses them. The two
renames hit two independent shares of the product pages (chosen by product id, the same on
every run), as real redesigns roll out unevenly: the pages that lost their price get their
items rejected, those that lost only their brand store items without one. The JSON-LD is
untouched. ``DemoSite(catalog, break_layout=0.5)`` or ``scrapy demo --break-layout``.
"""

from __future__ import annotations

import zlib

from .catalog import Product
from .pages import Page

RENAMES = {"price": (b'class="price"', b'class="amount"'), "brand": (b'class="brand"', b'class="maker"')}


def redesigned(product: Product, part: str, share: float) -> bool:
    """Whether *part* of *product*'s page has the new layout (deterministic per product)."""
    return zlib.crc32(f"{part}:{product.id}".encode()) % 10_000 < share * 10_000


def apply(page: Page, product: Product, share: float, parts: tuple[str, ...] = tuple(RENAMES)) -> Page:
    """*page* (the product's page) in the new layout where *share* says so (of *parts* alone)."""
    if share <= 0 or page.status != 200:
        return page
    body = page.body
    for part, (old, new) in RENAMES.items():
        if part in parts and redesigned(product, part, share):
            body = body.replace(old, new)
    if body is page.body:
        return page
    return Page(page.status, page.content_type, body, page.headers)
