"""The bundled demo shop (``make demo-site``): the model of a one-site spider."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import scrapy
from scrapy.http import Response

from ..items import ProductItem
from .base import CatalogSpider


class DemoSpider(CatalogSpider):
    name = "demo"
    follow_css = ("nav.categories a.category", "a.next")
    product_css = "a.product-link"
    # The shop's own currency, for prices shown without one ("Free", a bare "$").
    default_currency = "USD"
    # It writes numeric dates day first (12.11.2026 is 12 November).
    date_order = "DMY"
    # Shares of stored items that must have these fields (see docs/operations/data-quality.md): every
    # product on the shop has a brand and a release date.
    coverage = {"brand": 0.95, "released_at": 0.95}

    async def start(self) -> AsyncIterator[Any]:
        yield scrapy.Request(self.site_url(), callback=self.parse)

    def site_url(self) -> str:
        # -a url=... wins over the DEMO_SITE_URL setting.
        return getattr(self, "url", None) or self.settings["DEMO_SITE_URL"]

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        """Home and listing pages: links to categories, next pages and products.

        @page /
        @returns items 0 0
        @returns requests 8
        """
        yield from super().parse(response, **kwargs)

    def parse_product(self, response: Response) -> Iterator[ProductItem]:
        """A product page: one product.

        @page /p/1.html
        @returns items 1 1
        @returns requests 0 0
        @scrapes sku title price url brand description category availability image released_at
        """
        if not self.is_html(response):
            return
        yield ProductItem(
            sku=response.css(".sku::text").get(),
            title=response.css("h1.title::text").get(),
            price=response.css(".price::text").get(),
            url=response.css("link[rel=canonical]::attr(href)").get() or response.url,
            brand=response.css(".brand::text").get(),
            description=response.css(".description ::text").getall(),
            category=response.css(".breadcrumb a::text").getall()[-1:] or None,
            availability=response.css(".availability::text").get(),
            image=response.urljoin(response.css("img.main::attr(src)").get() or "") or None,
            released_at=response.css("time.released::text").get(),
        )
