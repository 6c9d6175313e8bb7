"""The small base class a one-site catalog spider is written on.

A subclass names the CSS selectors of the links to follow (categories, pagination) and of the
links to product pages, and implements ``parse_product``. Everything else (the shared queue,
cleaning, validation, storage) happens outside the spider.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import scrapy
from scrapy.http import Response, TextResponse

logger = logging.getLogger(__name__)


class CatalogSpider(scrapy.Spider):
    #: Selectors of links to more listing pages (categories, next page); followed with ``parse``.
    follow_css: tuple[str, ...] = ()
    #: Selector of links to product pages; followed with ``parse_product``.
    product_css: str = ""

    async def start(self) -> AsyncIterator[Any]:
        for url in self.start_urls:
            yield scrapy.Request(url, callback=self.parse)

    def site_url(self) -> str:
        """The site's root: where ``@page`` contracts (see :mod:`scraper.contracts`) resolve."""
        return self.start_urls[0] if self.start_urls else ""

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        if not self.is_html(response):
            return
        for selector in self.follow_css:
            for href in response.css(selector).xpath("@href").getall():
                yield response.follow(href, callback=self.parse)
        if self.product_css:
            for href in response.css(self.product_css).xpath("@href").getall():
                yield response.follow(href, callback=self.parse_product)

    def parse_product(self, response: Response) -> Iterator[Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement parse_product")

    def is_html(self, response: Response) -> bool:
        """False (and counted) for a response that is not text, e.g. an image served as a page."""
        if isinstance(response, TextResponse):
            return True
        self.crawler.stats.inc_value("spider/non_text_responses")
        logger.warning("Skipped %s: not a text response (%s)", response.url, response.headers.get("Content-Type"))
        return False
