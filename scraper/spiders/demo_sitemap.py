"""The demo shop read from its sitemap (``/sitemap.xml``): the model of a sitemap spider, and
the one a revisit run (``scrapy crawl demo_sitemap --due``) is measured with, since the sitemap's
``lastmod`` says which product pages changed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import scrapy
from scrapy.spiders import SitemapSpider

from .base import CatalogSpider
from .demo import DemoSpider


class DemoSitemapSpider(SitemapSpider):
    name = "demo_sitemap"
    sitemap_rules = [("/p/", "parse_product")]
    default_currency = DemoSpider.default_currency
    date_order = DemoSpider.date_order
    coverage = DemoSpider.coverage

    async def start(self) -> AsyncIterator[Any]:
        # -a sitemap=sitemap.xml.gz reads the gzipped copy.
        path = getattr(self, "sitemap", None) or "sitemap.xml"
        yield scrapy.Request(f"{self.site_url().rstrip('/')}/{path}", callback=self._parse_sitemap)

    site_url = DemoSpider.site_url
    parse_product = DemoSpider.parse_product
    is_html = CatalogSpider.is_html
