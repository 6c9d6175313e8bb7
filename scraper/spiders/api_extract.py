"""A generic spider with no selectors: the scraping API extracts every product.

``scrapy crawl api_extract -a url=https://shop.example/ [-a profile=product] [-a max_pages=500]``
follows the links of the start URL's site and asks the API for structured extraction on every
page: an ``extraction_profile`` when ``-a profile`` is given, otherwise an ``extraction_schema``
built from ``ProductItem``'s declared fields. Each extracted product goes through the same
cleaning, validation, dedupe and store as any spider's items; pages with no product (listings)
are crawled for their links only. Needs ``SCRAPING_API_KEY`` with the ``alterlab`` provider;
extraction is billed like any call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import scrapy
from scrapy.http import Response
from scrapy.linkextractors import LinkExtractor

from ..config import ConfigError
from ..items import ProductItem
from ..scraping_api.extraction import extraction_of, extraction_schema, items_from_extraction
from .base import CatalogSpider

PROFILES = (
    "product",
    "auto",
    "article",
    "job_posting",
    "faq",
    "recipe",
    "event",
    "ecommerce_homepage",
    "directory_listing",
)


class ApiExtractSpider(CatalogSpider):
    name = "api_extract"
    custom_settings = {"DEPTH_LIMIT": 5}

    def __init__(
        self, url: str | None = None, profile: str | None = None, max_pages: str | int = 1000, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if profile and profile not in PROFILES:
            raise ValueError(f"api_extract: -a profile must be one of {', '.join(PROFILES)}, got {profile!r}")
        self.start_urls = [url] if url else []
        self.max_pages = int(max_pages)
        self.scraping_api = (
            {"extraction_profile": profile} if profile else {"extraction_schema": extraction_schema(ProductItem)}
        )
        self.links = LinkExtractor()
        self._pages = 0

    @classmethod
    def check_settings(cls, settings: Any) -> None:
        """Called by ``scrapy crawl`` before anything starts: a missing key is one line."""
        if not settings.get("SCRAPING_API_KEY") or (settings.get("SCRAPING_API_PROVIDER") or "alterlab") != "alterlab":
            raise ConfigError(
                "SCRAPING_API_KEY: api_extract has the scraping API extract the data: set "
                "SCRAPING_API_KEY (with SCRAPING_API_PROVIDER=alterlab, the provider that extracts)"
            )

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> ApiExtractSpider:
        cls.check_settings(crawler.settings)  # scrapyd and scripts start spiders without our command
        return super().from_crawler(crawler, *args, **kwargs)

    async def start(self) -> AsyncIterator[Any]:
        for url in self.start_urls:
            yield scrapy.Request(url, callback=self.parse)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        result = extraction_of(response)
        if not self.is_html(response):
            return
        self._pages += 1
        found = 0
        for item in items_from_extraction(response, ProductItem, result):
            found += 1
            yield item
        if not found:
            self.crawler.stats.inc_value("api_extract/pages_without_product")
        if self._pages < self.max_pages:
            host = urlsplit(response.url).hostname
            for link in self.links.extract_links(response):
                if urlsplit(link.url).hostname == host:
                    yield response.follow(link.url, callback=self.parse)
