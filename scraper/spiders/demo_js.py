"""The demo shop's JavaScript-only section (``/js/``): every page rendered in a browser.

A plain fetch of these pages finds no product; with ``render`` the node's browser runs the
shop's script, and the spider reads the DOM it built, as it would read any page.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import scrapy
from scrapy.http import Response

from ..items import ProductItem
from .base import CatalogSpider

# The lists: wait for the first products, then "Load more" until it is gone, or scroll to the end.
LOAD_MORE = {"wait_for": "ul.products li.product", "click": "button.load-more"}
SCROLL = {"wait_for": "div.sentinel, ul.products li.product", "scroll": True}
# A product's details come a moment after the page loads, or an error box that a second render fixes.
PRODUCT = {"wait_for": ".product-detail .price", "retry_if": ".error-box"}


class DemoJsSpider(CatalogSpider):
    name = "demo_js"
    product_css = "a.product-link"
    render = LOAD_MORE
    default_currency = "USD"
    date_order = "DMY"

    async def start(self) -> AsyncIterator[Any]:
        yield scrapy.Request(self.site_url() + "js/", callback=self.parse)
        yield scrapy.Request(self.site_url() + "js/scroll/", callback=self.parse, meta={"render": SCROLL})

    def site_url(self) -> str:
        url = getattr(self, "url", None) or self.settings["DEMO_SITE_URL"]
        return url if url.endswith("/") else url + "/"

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        """A list of products, as the script built it."""
        if not self.is_html(response):
            return
        for href in response.css(self.product_css).xpath("@href").getall():
            yield response.follow(href, callback=self.parse_product, meta={"render": PRODUCT})

    def parse_product(self, response: Response) -> Iterator[ProductItem]:
        """A product page, once its details have arrived."""
        if not self.is_html(response):
            return
        yield ProductItem(
            sku=response.css(".sku::text").get(),
            title=response.css("h1.title::text").get(),
            price=response.css(".price::text").get(),
            url=response.css("link[rel=canonical]::attr(href)").get() or response.url,
            brand=response.css(".brand::text").get(),
            released_at=response.css("time.released::text").get(),
        )
